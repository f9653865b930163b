// Package postgres is the PostgreSQL deadletter.Store, on pgx/v5.
//
// Dead letters live in the table nudge_dead_letters, one row per record; create it with
// Store.Migrate (or all of nudge's tables with the driver core's postgres.Migrate). The table
// is meant to be read by operators with plain SQL as well as through this package, e.g. the
// open dead letters per projection and failing event:
//
//	SELECT id, projection, status, count, attempts, last_failed_at,
//	       failing_event_type, failing_event_id, failing_stream_id, error
//	FROM nudge_dead_letters
//	WHERE status <> 'resolved'
//	ORDER BY projection, id;
//
// payload is bytea (an invalid trigger is kept byte for byte; convert_from(payload, 'UTF8')
// shows a valid one as text), metadata is jsonb, and the failing event's position is the pair
// (failing_transaction_id xid8, failing_global_position bigint), as in nudge_projections.
// status is one of 'failed', 'replayed' and 'resolved'. Change rows through the Store (or
// deadletter.Replay), which keeps the folding rule; deleting rows by hand is harmless.
//
// # Folding
//
// Add is one statement, INSERT … ON CONFLICT (projection, fold_key) WHERE status <> 'resolved'
// DO UPDATE, on a unique partial index. fold_key is a generated column: the failing event's id,
// or 'message:' || message_uuid for an invalid trigger. Concurrent Adds for one event therefore
// fold into one record without locks or retries, and a resolved record, which leaves the
// index, is never folded into.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/clean"
	"github.com/nudgeworks/nudge/deadletter/internal/dlstore"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgmigrate"
	"github.com/nudgeworks/nudge/postgres"
)

// querier is the part of DB and pgx.Tx that the store's statements use.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store.
type Config struct {
	// Schema holds the store's table. Defaults to "", which means the connection's search_path
	// (usually public). A schema name is lowercase letters, digits and _. Use the event store's
	// schema to keep nudge's tables together.
	Schema string
}

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config or a database
// handle it cannot use; the message names the field and what to do.
var ErrInvalidConfig = errors.New("deadletter/postgres: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it. Every field's
// zero value is its default today (Schema "" is the search path).
func (cfg Config) WithDefaults() Config { return cfg }

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if err := postgres.ValidateSchema(cfg.Schema); err != nil {
		return fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Store is the PostgreSQL dead-letter store. It is safe for concurrent use.
type Store struct {
	db     postgres.DB
	schema string
	sql    statements
	now    func() time.Time
}

var _ deadletter.Store = (*Store)(nil)

// New returns a store on db. It does not touch the database; call Migrate once at start-up.
func New(db postgres.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: New needs a database handle (a *pgxpool.Pool), got nil", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{db: db, schema: cfg.Schema, sql: newStatements(cfg.Schema), now: time.Now}, nil
}

// Migrate creates or upgrades the store's table alone: postgres.Migrate with
// postgres.ComponentDeadLetters in the store's schema (postgres.Migrate without components
// migrates every component's tables at once). It is safe to run at every start and from
// several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	return postgres.Migrate(ctx, s.db, s.schema, postgres.ComponentDeadLetters)
}

// MigrateTx is Migrate inside the caller's transaction.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	return postgres.MigrateTx(ctx, tx, s.schema, postgres.ComponentDeadLetters)
}

// Schema returns the schema the store's table is in ("" for the search path).
func (s *Store) Schema() string { return s.schema }

// Add implements deadletter.Store, in one statement of its own.
func (s *Store) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	return s.add(ctx, s.db, e)
}

// AddTx is Add inside the caller's transaction: a worker that records a projection's failure
// in its own transaction can write the dead letter with it. The record is visible to others
// when tx commits; a concurrent Add of the same event waits for that commit and then folds.
func (s *Store) AddTx(ctx context.Context, tx pgx.Tx, e deadletter.Entry) (deadletter.Record, error) {
	if tx == nil {
		return deadletter.Record{}, nilTx("AddTx", "Add")
	}
	return s.add(ctx, tx, e)
}

func (s *Store) add(ctx context.Context, q querier, e deadletter.Entry) (deadletter.Record, error) {
	e, err := dlstore.NormalizeEntry(e, s.now())
	if err != nil {
		return deadletter.Record{}, err
	}
	r, err := scanRecord(q.QueryRow(ctx, s.sql.add, addArgs(e)...))
	if err != nil {
		return deadletter.Record{}, s.translate(fmt.Errorf("deadletter/postgres: add a dead letter for projection %s: %w", e.Projection, err))
	}
	return r, nil
}

// Get implements deadletter.Store.
func (s *Store) Get(ctx context.Context, id int64) (deadletter.Record, error) {
	r, err := scanRecord(s.db.QueryRow(ctx, s.sql.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return deadletter.Record{}, &deadletter.NotFoundError{ID: id}
	}
	if err != nil {
		return deadletter.Record{}, s.translate(fmt.Errorf("deadletter/postgres: get record %d: %w", id, err))
	}
	return r, nil
}

// List implements deadletter.Store.
func (s *Store) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Record, error) {
	f, err := dlstore.NormalizeFilter(f)
	if err != nil {
		return nil, err
	}
	query, args := s.sql.listQuery(f)
	rows, err := s.db.Query(ctx, query, args...)
	if err != nil {
		return nil, s.translate(fmt.Errorf("deadletter/postgres: list: %w", err))
	}
	defer rows.Close()
	var out []deadletter.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("deadletter/postgres: list: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.translate(fmt.Errorf("deadletter/postgres: list: %w", err))
	}
	return out, nil
}

// MarkReplayed implements deadletter.Store, in one statement of its own.
func (s *Store) MarkReplayed(ctx context.Context, ids []int64, by string, at time.Time) (int, error) {
	return s.markReplayed(ctx, s.db, ids, by, at)
}

// MarkReplayedTx is MarkReplayed inside the caller's transaction.
func (s *Store) MarkReplayedTx(ctx context.Context, tx pgx.Tx, ids []int64, by string, at time.Time) (int, error) {
	if tx == nil {
		return 0, nilTx("MarkReplayedTx", "MarkReplayed")
	}
	return s.markReplayed(ctx, tx, ids, by, at)
}

func (s *Store) markReplayed(ctx context.Context, q querier, ids []int64, by string, at time.Time) (int, error) {
	by, err := dlstore.NormalizeActor("MarkReplayed's by", by)
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if at.IsZero() {
		at = s.now()
	}
	tag, err := q.Exec(ctx, s.sql.markReplayed, ids, by, clean.Time(at))
	if err != nil {
		return 0, s.translate(fmt.Errorf("deadletter/postgres: mark %d records replayed: %w", len(ids), err))
	}
	return int(tag.RowsAffected()), nil
}

// Resolve implements deadletter.Store, in one statement of its own.
func (s *Store) Resolve(ctx context.Context, id int64, by, note string, at time.Time) error {
	return s.resolve(ctx, s.db, id, by, note, at)
}

// ResolveTx is Resolve inside the caller's transaction.
func (s *Store) ResolveTx(ctx context.Context, tx pgx.Tx, id int64, by, note string, at time.Time) error {
	if tx == nil {
		return nilTx("ResolveTx", "Resolve")
	}
	return s.resolve(ctx, tx, id, by, note, at)
}

func (s *Store) resolve(ctx context.Context, q querier, id int64, by, note string, at time.Time) error {
	by, err := dlstore.NormalizeActor("Resolve's by", by)
	if err != nil {
		return err
	}
	if at.IsZero() {
		at = s.now()
	}
	var exists bool
	if err := q.QueryRow(ctx, s.sql.resolve, id, by, clean.Text(note), clean.Time(at)).Scan(&exists); err != nil {
		return s.translate(fmt.Errorf("deadletter/postgres: resolve record %d: %w", id, err))
	}
	if !exists {
		return &deadletter.NotFoundError{ID: id}
	}
	return nil
}

// ResolvePassed implements deadletter.Store, in one statement of its own.
func (s *Store) ResolvePassed(ctx context.Context, projection string, passed eventstore.Position, at time.Time) (int, error) {
	return s.resolvePassed(ctx, s.db, projection, passed, at)
}

// ResolvePassedTx is ResolvePassed inside the caller's transaction.
func (s *Store) ResolvePassedTx(ctx context.Context, tx pgx.Tx, projection string, passed eventstore.Position, at time.Time) (int, error) {
	if tx == nil {
		return 0, nilTx("ResolvePassedTx", "ResolvePassed")
	}
	return s.resolvePassed(ctx, tx, projection, passed, at)
}

func (s *Store) resolvePassed(ctx context.Context, q querier, projection string, passed eventstore.Position, at time.Time) (int, error) {
	if err := dlstore.NormalizePassed(projection); err != nil {
		return 0, err
	}
	if at.IsZero() {
		at = s.now()
	}
	at = clean.Time(at)
	tag, err := q.Exec(ctx, s.sql.resolvePassed, projection, passed.TransactionID, passed.GlobalPosition,
		deadletter.HealedBy, dlstore.HealedNote(passed, at), at, deadletter.MetadataTransient)
	if err != nil {
		return 0, s.translate(fmt.Errorf("deadletter/postgres: resolve the records projection %s passed: %w", projection, err))
	}
	return int(tag.RowsAffected()), nil
}

// Purge implements deadletter.Store, in one statement of its own.
func (s *Store) Purge(ctx context.Context, opts deadletter.PurgeOptions) (int, error) {
	return s.purge(ctx, s.db, opts)
}

// PurgeTx is Purge inside the caller's transaction.
func (s *Store) PurgeTx(ctx context.Context, tx pgx.Tx, opts deadletter.PurgeOptions) (int, error) {
	if tx == nil {
		return 0, nilTx("PurgeTx", "Purge")
	}
	return s.purge(ctx, tx, opts)
}

func (s *Store) purge(ctx context.Context, q querier, opts deadletter.PurgeOptions) (int, error) {
	opts, err := dlstore.NormalizePurge(opts, s.now())
	if err != nil {
		return 0, err
	}
	query := s.sql.purge[0]
	if opts.IncludeUnresolved {
		query = s.sql.purge[1]
	}
	tag, err := q.Exec(ctx, query, dlstore.Cutoff(opts))
	if err != nil {
		return 0, s.translate(fmt.Errorf("deadletter/postgres: purge: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

// translate turns the driver errors a user can cause into errors that say what to do: a
// missing table (Migrate never ran on this database or schema) into deadletter.ErrNotMigrated.
func (s *Store) translate(err error) error {
	if pgmigrate.Missing(err, s.schema, "nudge_dead_letters") && !errors.Is(err, deadletter.ErrNotMigrated) {
		return fmt.Errorf("%w (table %s): %w", deadletter.ErrNotMigrated, s.sql.table, err)
	}
	return err
}

func nilTx(method, alternative string) error {
	return fmt.Errorf("%w: %s got a nil transaction; use %s to write in a statement of the store's own", deadletter.ErrInvalidInput, method, alternative)
}
