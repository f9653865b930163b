// Package pgmigrate applies nudge's embedded, numbered SQL migrations to PostgreSQL: the engine
// under the driver core's postgres.Migrate, the one entry point that uses it.
//
// Each nudge component (the event store, the projection positions, the dead letters, the
// channel's queue) owns a set of files named NNNN_description.sql. Run applies the ones not yet recorded in the
// nudge_schema_migrations table, in order, inside the caller's transaction and under a
// transaction-scoped advisory lock: two processes migrating at once both succeed, one waits for
// the other and then finds nothing left to do.
package pgmigrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// Load reads the migrations in dir of fsys. Every file must be named NNNN_description.sql,
// numbered from 0001 without gaps.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("pgmigrate: read %s: %w", dir, err)
	}
	var migs []Migration
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("pgmigrate: %s: file name must look like 0001_create_events.sql", e.Name())
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("pgmigrate: read %s: %w", e.Name(), err)
		}
		v, _ := strconv.Atoi(m[1])
		migs = append(migs, Migration{Version: v, Name: m[2], SQL: string(body)})
	}
	slices.SortFunc(migs, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range migs {
		if m.Version != i+1 {
			return nil, fmt.Errorf("pgmigrate: %s: migration %04d is missing or doubled", dir, i+1)
		}
	}
	return migs, nil
}

// lockKey is the advisory lock every nudge migration takes (advisory locks are per database).
const lockKey = "nudge.pgmigrate"

// Run applies the migrations of component that tx's database has not recorded yet and returns
// the versions it applied. When schema is not empty, the schema is created if missing and the
// migrations run with it as the search path (restored afterwards). The caller commits tx.
//
// With nothing to apply it runs no DDL at all (it creates neither the schema nor the table
// nudge_schema_migrations when they exist), so a role that may only read and write nudge's
// tables runs it at every start.
func Run(ctx context.Context, tx pgx.Tx, component, schema string, migs []Migration) ([]int, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, lockKey); err != nil {
		return nil, fmt.Errorf("pgmigrate: take the migration lock: %w", err)
	}
	if schema != "" {
		restore, err := useSchema(ctx, tx, schema)
		if err != nil {
			return nil, err
		}
		defer restore()
	}
	if err := createMigrationsTable(ctx, tx); err != nil {
		return nil, err
	}
	var done int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM nudge_schema_migrations WHERE component = $1`, component).Scan(&done); err != nil {
		return nil, fmt.Errorf("pgmigrate: read applied migrations: %w", err)
	}
	if done > len(migs) {
		return nil, fmt.Errorf("pgmigrate: %s schema is at version %d but this build knows only %d migrations; upgrade nudge", component, done, len(migs))
	}
	var applied []int
	for _, m := range migs[done:] {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("pgmigrate: %s migration %04d_%s: %w", component, m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO nudge_schema_migrations (component, version, name) VALUES ($1, $2, $3)`,
			component, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("pgmigrate: record %s migration %04d: %w", component, m.Version, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// useSchema creates schema if it does not exist and makes it tx's search path; restore sets
// the search path back.
func useSchema(ctx context.Context, tx pgx.Tx, schema string) (restore func(), err error) {
	ident := pgx.Identifier{schema}.Sanitize()
	var (
		previous string
		exists   bool
	)
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path'), EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`,
		schema).Scan(&previous, &exists); err != nil {
		return nil, fmt.Errorf("pgmigrate: read search_path: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident); err != nil {
			return nil, fmt.Errorf("pgmigrate: create schema %s: %w", ident, err)
		}
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, ident); err != nil {
		return nil, fmt.Errorf("pgmigrate: set search_path: %w", err)
	}
	return func() {
		// Best effort: if tx has failed, the whole transaction is rolled back anyway.
		_, _ = tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, previous)
	}, nil
}

// createMigrationsTable creates nudge_schema_migrations in the schema where the search path
// creates tables, if it is not there.
func createMigrationsTable(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_class
		WHERE relname = 'nudge_schema_migrations' AND relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))`).Scan(&exists); err != nil {
		return fmt.Errorf("pgmigrate: look for nudge_schema_migrations: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS nudge_schema_migrations (
		component  text        NOT NULL,
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, version)
	)`); err != nil {
		return fmt.Errorf("pgmigrate: create nudge_schema_migrations: %w", err)
	}
	return nil
}
