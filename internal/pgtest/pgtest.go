// Package pgtest gives each test a fresh PostgreSQL database of its own, dropped when the test
// ends, so tests run in parallel and leave nothing behind.
//
// The server comes from NUDGE_TEST_POSTGRES_URL (default URLDefault). If it cannot be reached,
// the test is skipped with a message saying how to start it — unless CI=true, where an
// unreachable server fails the test.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// URLDefault is the server used when NUDGE_TEST_POSTGRES_URL is not set.
const URLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// dbPrefix starts the name of every database this package creates.
const dbPrefix = "nudge_test_"

// serverTimeout bounds (scaled by testwait) each of the server's answers to this package: a
// busy server takes seconds to create or drop a database.
const serverTimeout = 2 * time.Minute

// staleAfter is the age after which a leftover test database (of a killed run) is dropped.
const staleAfter = 2 * time.Hour

// URL returns the URL of the test server's maintenance database.
func URL() string {
	if u := os.Getenv("NUDGE_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return URLDefault
}

// DB is a database that exists for one test.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it.
	URL string
	// Pool is a connection pool on it, closed when the test ends.
	Pool *pgxpool.Pool
}

var (
	adminOnce sync.Once
	admin     *pgxpool.Pool
	adminErr  error
)

// New creates a database for t and a pool of up to 8 connections to it; both are removed when
// t ends.
func New(t testing.TB) *DB {
	t.Helper()
	pool := adminPool(t)
	name := fmt.Sprintf("%s%d_%s", dbPrefix, time.Now().Unix(), randomHex(4))
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	db := &DB{Name: name, URL: withDatabase(t, URL(), name)}
	// Registered first, so it runs after every pool of the test has been closed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	db.Pool = db.NewPool(t, 8)
	return db
}

// NewPool opens another pool of up to maxConns connections on the database, closed when t ends.
func (db *DB) NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact.URL(db.URL), err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", redact.URL(db.URL), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func adminPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	adminOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
		defer cancel()
		admin, adminErr = pgxpool.New(ctx, URL())
		if adminErr == nil {
			adminErr = admin.Ping(ctx)
		}
		if adminErr == nil {
			dropStale(ctx, admin)
		}
	})
	if adminErr != nil {
		msg := fmt.Sprintf("pgtest: PostgreSQL at %s is not reachable: %v\n"+
			"Start it with `make up` (or scripts/services.sh), or point NUDGE_TEST_POSTGRES_URL at a server.",
			redact.URL(URL()), adminErr)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return admin
}

// dropStale removes test databases left behind by runs that were killed before their cleanup.
func dropStale(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1`, dbPrefix+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		stamp, _, _ := strings.Cut(strings.TrimPrefix(name, dbPrefix), "_")
		sec, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil || time.Since(time.Unix(sec, 0)) < staleAfter {
			continue
		}
		_, _ = pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
}

func withDatabase(t testing.TB, raw, name string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("pgtest: NUDGE_TEST_POSTGRES_URL must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// horizonTurnKey keys the advisory lock of HoldHorizonTurn ("nhtt" in ASCII).
const horizonTurnKey = 1852339316

// HoldHorizonTurn makes t wait for, and then hold until it ends, the one turn that tests of
// every package share to keep a writing transaction open while they wait for the event store's
// horizon (to show that readers need not wait for that transaction). The horizon is
// cluster-wide: two such tests in different databases would otherwise each wait for the other's
// open transaction until both time out. The turn is a session-level advisory lock on a
// connection of its own, which holds no transaction open.
func HoldHorizonTurn(t testing.TB) {
	t.Helper()
	adminPool(t) // skips or fails like New when the server is unreachable
	// Tests of every package (and of every checkout on a shared server) queue for the turn.
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(10*time.Minute))
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", redact.URL(URL()), err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // closing releases the lock
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(horizonTurnKey)); err != nil {
		t.Fatalf("pgtest: wait for the horizon turn: %v", err)
	}
}
