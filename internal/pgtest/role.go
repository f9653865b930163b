package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// LeastPrivilegeGrants are the grants of a role that may only read and write nudge's tables in
// a schema ({schema}), as a least-privilege deploy gives the role its services run as: no
// CREATE, no ownership. docs/guides/least-privilege.md shows them.
var LeastPrivilegeGrants = []string{
	`GRANT USAGE ON SCHEMA {schema} TO {role}`,
	`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}`,
	`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}`,
}

// LeastPrivilegePool creates a login role of its own for t, granted LeastPrivilegeGrants on
// schema ("" for public) over the tables that exist now, and returns a pool of up to 4
// connections to db as that role. The pool is closed and the role dropped when t ends.
func (db *DB) LeastPrivilegePool(t testing.TB, schema string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
	defer cancel()
	role := fmt.Sprintf("%srole_%d_%s", dbPrefix, time.Now().Unix(), randomHex(4))
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := adminPool(t).Exec(ctx, `CREATE ROLE `+ident+` LOGIN`); err != nil {
		t.Fatalf("pgtest: create role %s: %v", role, err)
	}
	var pool *pgxpool.Pool
	// Registered after db's pool, so it runs before that pool closes: the grants in db go
	// with DROP OWNED, then the role.
	t.Cleanup(func() {
		if pool != nil {
			pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), testwait.For(serverTimeout))
		defer cancel()
		if _, err := db.Pool.Exec(ctx, `DROP OWNED BY `+ident); err != nil {
			t.Errorf("pgtest: drop the grants of role %s: %v", role, err)
		}
		if _, err := adminPool(t).Exec(ctx, `DROP ROLE `+ident); err != nil {
			t.Errorf("pgtest: drop role %s: %v", role, err)
		}
	})
	if schema == "" {
		schema = "public"
	}
	for _, grant := range LeastPrivilegeGrants {
		sql := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{role}", ident).Replace(grant)
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("pgtest: %s: %v", sql, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact.URL(db.URL), err)
	}
	cfg.ConnConfig.User = role
	cfg.MaxConns = 4
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatalf("pgtest: connect to %s as %s: %v", redact.URL(db.URL), role, err)
	}
	return pool
}
