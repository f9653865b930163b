package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/internal/pgmigrate"
)

// Component is a part of nudge whose tables are migrated as a unit; its migrations are
// recorded under its name in the table nudge_schema_migrations.
type Component string

// The components, in the order Migrate runs them. Their names are the ones the components'
// own Migrate methods have always recorded, so a database migrated component by component
// migrates again with nothing to do.
const (
	// ComponentEvents is the event store (eventstore/postgres): the tables nudge_events and
	// nudge_streams.
	ComponentEvents Component = "eventstore"
	// ComponentProjections are the projections' positions and status (projection/postgres):
	// the tables nudge_projections, nudge_projection_skips, nudge_projection_parked,
	// nudge_projection_park_actions, nudge_partition_leases,
	// nudge_partition_members and nudge_projection_versions, and the view
	// nudge_projection_conditions once the event store's tables exist. It reads the event
	// store's tables, so it is migrated after ComponentEvents.
	ComponentProjections Component = "projection"
	// ComponentDeadLetters is the dead-letter store (deadletter/postgres): the table
	// nudge_dead_letters.
	ComponentDeadLetters Component = "deadletter"
	// ComponentQueue is the PostgreSQL channel's trigger queue (channel/postgres): the tables
	// nudge_channel_subscriptions and nudge_channel_triggers. A deployment on RabbitMQ does not
	// need it.
	ComponentQueue Component = "channel"
)

// Components returns every component, in the order Migrate runs them (dependencies first).
func Components() []Component {
	return []Component{ComponentEvents, ComponentProjections, ComponentDeadLetters, ComponentQueue}
}

//go:embed migrations
var migrationFiles embed.FS

// Migrate creates or upgrades the tables of components in schema ("" for the connection's
// search_path, which must then name a schema to create them in), in one transaction of db.
// Without components it migrates all of them. Components run in the order of Components,
// whatever the order given, each with its migrations not yet recorded in
// nudge_schema_migrations; a schema that is not there yet is created. When ComponentEvents or
// ComponentProjections is among them and the tables of both exist, the view
// nudge_projection_conditions is created, or replaced if this version of the code defines it
// otherwise (it embeds the horizon; its comment records the version of its definition).
//
// It is safe to run at every start and from several processes at once: the migrations run
// under a transaction-scoped advisory lock, so a second process waits for the first and then
// finds nothing left to do. With nothing to do it runs no DDL, so a role that may only read and
// write nudge's tables (USAGE on the schema, SELECT, INSERT, UPDATE and DELETE on its tables,
// USAGE, SELECT and UPDATE on its sequences) runs it at every start once the tables' owner has
// migrated; when that role finds something to migrate, the error is a *PrivilegeError (it
// matches ErrPrivilege).
func Migrate(ctx context.Context, db DB, schema string, components ...Component) error {
	if db == nil {
		return errors.New("postgres: Migrate needs a database handle (a *pgxpool.Pool), got nil")
	}
	if _, err := plan(schema, components); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return MigrateTx(ctx, tx, schema, components...) })
}

// MigrateTx is Migrate inside the caller's transaction; the migrations take effect when the
// caller commits tx. The caller's search_path is left as it was.
func MigrateTx(ctx context.Context, tx pgx.Tx, schema string, components ...Component) error {
	if tx == nil {
		return errors.New("postgres: MigrateTx needs a transaction, got nil; use Migrate to migrate in a transaction of its own")
	}
	todo, err := plan(schema, components)
	if err != nil {
		return err
	}
	return privilegeError(tx, migrate(ctx, tx, schema, todo))
}

// migrate runs the migrations of the components todo, in order, and replaces the view of
// their conditions if it changed.
func migrate(ctx context.Context, tx pgx.Tx, schema string, todo []Component) error {
	for _, c := range todo {
		migs, err := pgmigrate.Load(migrationFiles, "migrations/"+string(c))
		if err != nil {
			return err
		}
		if _, err := pgmigrate.Run(ctx, tx, string(c), schema, migs); err != nil {
			return fmt.Errorf("postgres: migrate %s: %w", c, err)
		}
	}
	if slices.Contains(todo, ComponentEvents) || slices.Contains(todo, ComponentProjections) {
		return replaceConditionsView(ctx, tx, schema)
	}
	return nil
}

// ErrPrivilege is matched (errors.Is) by the error Migrate returns when its role may not make
// a change the schema needs: a *PrivilegeError.
var ErrPrivilege = errors.New("postgres: the role may not migrate nudge's schema")

// PrivilegeError is Migrate's error when its role lacks a privilege a pending change needs
// (PostgreSQL's insufficient_privilege: creating the schema or a table, replacing a view it
// does not own). A role that may only read and write nudge's tables can run Migrate at every
// start, but only once the tables' owner has migrated with this version of nudge.
type PrivilegeError struct {
	// Role is the role Migrate ran as (the connection's user).
	Role string
	// Err is the failing step's error, the driver's *pgconn.PgError in its chain.
	Err error
}

func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("postgres: migrate: role %q may not make the change nudge's schema needs (%v): "+
		"run Migrate once as the role that owns nudge's tables (at deploy, or `nudge migrate`), then start with this one", e.Role, e.Err)
}

// Is reports whether target is ErrPrivilege.
func (e *PrivilegeError) Is(target error) bool { return target == ErrPrivilege }

// Unwrap returns Err.
func (e *PrivilegeError) Unwrap() error { return e.Err }

// insufficientPrivilege is PostgreSQL's SQLSTATE insufficient_privilege.
const insufficientPrivilege = "42501"

// privilegeError returns err as a *PrivilegeError when PostgreSQL refused it for a lack of
// privilege (SQLSTATE 42501), else err.
func privilegeError(tx pgx.Tx, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != insufficientPrivilege {
		return err
	}
	role := ""
	if conn := tx.Conn(); conn != nil {
		role = conn.Config().User
	}
	return &PrivilegeError{Role: role, Err: err}
}

// plan checks schema and components and returns the components to migrate, in order.
func plan(schema string, components []Component) ([]Component, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all := Components()
	if len(components) == 0 {
		return all, nil
	}
	for _, c := range components {
		if !slices.Contains(all, c) {
			return nil, fmt.Errorf("postgres: unknown component %q: use one of %q (or none, for all)", c, all)
		}
	}
	return slices.DeleteFunc(all, func(c Component) bool { return !slices.Contains(components, c) }), nil
}
