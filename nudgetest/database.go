package nudgetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/postgres"
)

// URLDefault is the server Database uses when Options.URL is empty and none of
// NUDGE_TEST_DATABASE_URL, NUDGE_TEST_POSTGRES_URL and DATABASE_URL is set.
const URLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// MaxConnsDefault is the size of a test database's pool when Options.MaxConns is 0.
const MaxConnsDefault = 8

// namePrefix starts the name of every database this package creates; templatePrefix the name
// of its templates.
const (
	namePrefix     = "nudgetest_"
	templatePrefix = namePrefix + "t"
)

// serverTimeout bounds each of the server's answers: a busy server takes seconds to create or
// drop a database.
const serverTimeout = 2 * time.Minute

// staleAfter is the age after which a test database of an earlier run is dropped. A template
// is dropped as soon as the process that built it has ended (see holdTemplate).
const staleAfter = 2 * time.Hour

// templateLockClass is the first key of the advisory lock by which a process holds its
// templates ("nt" in ASCII); the second is hashtext of the template's name.
const templateLockClass = 28276

// Options says where and how Database creates a test's database. Every field is optional.
type Options struct {
	// URL connects to the server, to any database on it (its maintenance database, postgres,
	// say); Database creates its databases beside it and never writes to it. The role needs
	// CREATEDB. Defaults to NUDGE_TEST_DATABASE_URL, then NUDGE_TEST_POSTGRES_URL, then
	// DATABASE_URL, then URLDefault.
	URL string
	// Schema holds nudge's tables, as nudge.Config.Schema, and is the search_path of
	// DB.Pool and of MigrateFunc's pool, so unqualified names (the service's tables, a read
	// model's) are in it. Defaults to "", the server's search_path (public).
	Schema string
	// MigrateFunc, if set, runs the service's own migrations (read-model tables and the like)
	// on the template, after nudge's: once per test process, not once per test. One template
	// is built per URL, Schema and MigrateFunc (told apart by its code: two closures of one
	// function literal share a template).
	MigrateFunc func(ctx context.Context, pool *pgxpool.Pool) error
	// MaxConns is the size of DB.Pool. Defaults to MaxConnsDefault.
	MaxConns int32
}

// url returns the server URL o names or the environment's.
func (o Options) url() string {
	if o.URL != "" {
		return o.URL
	}
	for _, env := range []string{"NUDGE_TEST_DATABASE_URL", "NUDGE_TEST_POSTGRES_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			return u
		}
	}
	return URLDefault
}

// DB is a migrated database that exists for one test.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it.
	URL string
	// Pool is a pool on it, closed when the test ends; its search_path is Schema, if set.
	Pool *pgxpool.Pool
	// Schema is Options.Schema: where nudge's tables are.
	Schema string
}

// Database returns a database of t's own with nudge's tables (and, with Options.MigrateFunc,
// the service's) in it, dropped when t ends. It is a copy of a template database that the
// first call of the test process migrates (CREATE DATABASE … TEMPLATE), so a test pays for a
// copy, not for the migrations. Tests that call it may run in parallel.
//
// If the server cannot be reached, t is skipped with a message saying so, unless the
// environment has CI=true: then t fails, so a CI run never passes by skipping its tests.
// The next run drops the templates of test processes that have ended, and test databases a
// killed run left behind once they are two hours old.
func Database(t testing.TB, opts Options) *DB {
	t.Helper()
	srv := server(t, opts.url())
	tpl := srv.template(t, opts)
	name := fmt.Sprintf("%s%d_%s", namePrefix, time.Now().Unix(), randomHex(4))
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	if _, err := srv.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tpl}.Sanitize()); err != nil {
		t.Fatalf("nudgetest: create database %s from template %s: %v", name, tpl, err)
	}
	// Registered before the pool's Close, so it runs after it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
		defer cancel()
		if _, err := srv.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("nudgetest: drop database %s: %v", name, err)
		}
	})
	db := &DB{Name: name, URL: withDatabase(t, srv.url, name), Schema: opts.Schema}
	pool, err := openPool(db.URL, cmpOr(opts.MaxConns, MaxConnsDefault), opts.Schema)
	if err != nil {
		t.Fatalf("nudgetest: %v", err)
	}
	t.Cleanup(pool.Close)
	db.Pool = pool
	return db
}

func cmpOr(v, def int32) int32 {
	if v > 0 {
		return v
	}
	return def
}

// openPool connects up to maxConns connections to rawURL, with schema (if set) as their
// search_path.
func openPool(rawURL string, maxConns int32, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", redact.URL(rawURL), err)
	}
	cfg.MaxConns = maxConns
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(rawURL), err)
	}
	return pool, nil
}

// srv is one server's admin pool and the templates built on it by this process.
type srv struct {
	url   string
	admin *pgxpool.Pool
	err   error

	mu        sync.Mutex
	templates map[templateKey]*template
	// holders are the connections that hold the templates' locks. They stay referenced for
	// the process's life: a connection the garbage collector finalised would close, and the
	// lock with it.
	holders []*pgx.Conn
}

type templateKey struct {
	schema  string
	migrate uintptr
}

type template struct {
	once sync.Once
	name string
	err  error
}

var (
	serversMu sync.Mutex
	servers   = map[string]*srv{}
)

// server returns the admin pool of the server at rawURL, connecting once per process; it skips
// or fails t when the server is unreachable.
func server(t testing.TB, rawURL string) *srv {
	t.Helper()
	serversMu.Lock()
	s, ok := servers[rawURL]
	if !ok {
		s = &srv{url: rawURL, templates: map[templateKey]*template{}}
		s.admin, s.err = openPool(rawURL, 4, "")
		if s.err == nil {
			s.err = ping(s.admin)
		}
		if s.err == nil {
			dropStale(s.admin)
		}
		servers[rawURL] = s
	}
	serversMu.Unlock()
	if s.err != nil {
		msg := fmt.Sprintf("nudgetest: PostgreSQL at %s is not reachable: %v\n"+
			"Start a server, or point NUDGE_TEST_DATABASE_URL (or Options.URL) at one.", redact.URL(rawURL), s.err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return s
}

func ping(pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	return pool.Ping(ctx)
}

// template returns the name of the template for opts, building it on first use.
func (s *srv) template(t testing.TB, opts Options) string {
	t.Helper()
	key := templateKey{schema: opts.Schema}
	if opts.MigrateFunc != nil {
		key.migrate = reflect.ValueOf(opts.MigrateFunc).Pointer()
	}
	s.mu.Lock()
	tpl, ok := s.templates[key]
	if !ok {
		tpl = &template{}
		s.templates[key] = tpl
	}
	s.mu.Unlock()
	tpl.once.Do(func() { tpl.name, tpl.err = s.build(opts) })
	if tpl.err != nil {
		t.Fatalf("nudgetest: build the template database: %v", tpl.err)
	}
	return tpl.name
}

// build creates and migrates a template database; nothing may stay connected to it. A
// template that fails to build is dropped.
func (s *srv) build(opts Options) (string, error) {
	name := fmt.Sprintf("%s%d_%s", templatePrefix, time.Now().Unix(), randomHex(4))
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	if err := s.holdTemplate(ctx, name); err != nil {
		return "", err
	}
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create %s: %w", name, err)
	}
	if err := s.migrate(ctx, name, opts); err != nil {
		_, _ = s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return "", err
	}
	return name, nil
}

// holdTemplate marks the template called name as in use for as long as this process lives,
// before it exists: a connection of its own, never closed, holds an advisory lock on the
// name, which the server releases when the process ends. A later run's dropStale drops a
// template whose lock no connection holds, in any database.
func (s *srv) holdTemplate(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return fmt.Errorf("connect to hold the template: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, templateLockClass, name); err != nil {
		_ = conn.Close(ctx)
		return fmt.Errorf("hold the template: %w", err)
	}
	s.mu.Lock()
	s.holders = append(s.holders, conn)
	s.mu.Unlock()
	return nil
}

// migrate runs nudge's migrations and opts.MigrateFunc on the database called name, and
// closes its connections.
func (s *srv) migrate(ctx context.Context, name string, opts Options) error {
	u, err := setDatabase(s.url, name)
	if err != nil {
		return err
	}
	pool, err := openPool(u, 2, opts.Schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool, opts.Schema); err != nil {
		return fmt.Errorf("migrate nudge's tables: %w", err)
	}
	if opts.MigrateFunc != nil {
		if err := opts.MigrateFunc(ctx, pool); err != nil {
			return fmt.Errorf("Options.MigrateFunc: %w", err)
		}
	}
	return nil
}

// dropStale drops the databases and templates of runs older than staleAfter.
func dropStale(pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1`, namePrefix+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		if stale(ctx, pool, name) {
			_, _ = pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
	}
}

// stale reports whether the database called name is left over: a template whose process has
// ended (nothing holds its lock, in any database), or anything older than staleAfter.
func stale(ctx context.Context, pool *pgxpool.Pool, name string) bool {
	rest := strings.TrimPrefix(name, namePrefix)
	if strings.HasPrefix(name, templatePrefix) {
		// The holder's lock is in the database its process's server URL names, which may not
		// be this pool's: advisory locks belong to a database, so it is looked for in pg_locks,
		// which shows every database's (a two-key lock is classid, objid, objsubid 2).
		var held bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = $1::int4::oid AND objid = hashtext($2)::oid AND objsubid = 2)`, templateLockClass, name).Scan(&held)
		if err == nil && !held {
			return true
		}
		rest = strings.TrimPrefix(name, templatePrefix)
	}
	stamp, _, _ := strings.Cut(rest, "_")
	sec, err := strconv.ParseInt(stamp, 10, 64)
	return err == nil && time.Since(time.Unix(sec, 0)) >= staleAfter
}

func withDatabase(t testing.TB, raw, name string) string {
	t.Helper()
	u, err := setDatabase(raw, name)
	if err != nil {
		t.Fatalf("nudgetest: %v", err)
	}
	return u
}

func setDatabase(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("the server URL must be a postgres:// URL, got %s", redact.URL(raw))
	}
	u.Path = "/" + name
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
