// Package postgres is nudge's one PostgreSQL driver core: the database handle every
// PostgreSQL component takes (DB), the rule for schema names (ValidateSchema), and one
// migration entry point for all of nudge's tables (Migrate, MigrateTx).
//
// The components keep their packages — the event store (eventstore/postgres), the projection
// positions (projection/postgres), the dead letters (deadletter/postgres) and the trigger queue
// (channel/postgres) — and each can still be migrated alone through its own Migrate. A
// deployment usually migrates them together at start-up or deploy time:
//
//	if err := postgres.Migrate(ctx, pool, schema); err != nil {
//		return err
//	}
//
// Their migrations are numbered SQL files embedded in this package, recorded per component in
// the table nudge_schema_migrations of the schema.
package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what nudge's PostgreSQL components need of the database; *pgxpool.Pool satisfies it.
// Components that run concurrent work on it (the channel's subscriptions, the runner's
// batches) need a pool, not a single connection.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}
