package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	nudgepg "github.com/nudgeworks/nudge/postgres"
)

// newStore returns a migrated store on a database of the test's own.
func newStore(t testing.TB, cfg postgres.Config) (*postgres.Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s, db
}

func TestSuite(t *testing.T) {
	t.Parallel()
	deadlettertest.Run(t, func(t *testing.T) deadletter.Store {
		s, _ := newStore(t, postgres.Config{})
		return s
	})
}

func TestSuiteInSchema(t *testing.T) {
	t.Parallel()
	deadlettertest.Run(t, func(t *testing.T) deadletter.Store {
		s, _ := newStore(t, postgres.Config{Schema: "ops"})
		return s
	})
}

// TestConfig: New refuses a nil database and a Config that cannot work with an error matching
// ErrInvalidConfig that names the field.
func TestConfig(t *testing.T) {
	t.Parallel()
	require.Equal(t, postgres.Config{Schema: "ops"}, postgres.Config{Schema: "ops"}.WithDefaults())
	require.NoError(t, postgres.Config{}.WithDefaults().Validate())

	_, err := postgres.New(nil, postgres.Config{})
	require.ErrorIs(t, err, postgres.ErrInvalidConfig)
	require.ErrorContains(t, err, "pgxpool")

	db := pgtest.New(t)
	for _, schema := range []string{"Ops; DROP", "1ops", "o-ps"} {
		_, err = postgres.New(db.Pool, postgres.Config{Schema: schema})
		require.ErrorIs(t, err, postgres.ErrInvalidConfig, schema)
		require.ErrorIs(t, err, nudgepg.ErrInvalidSchema, schema)
		require.ErrorContains(t, err, "Schema: ", schema)
		require.ErrorContains(t, err, "lowercase", schema)
	}
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t, postgres.Config{})
	require.NoError(t, s.Migrate(ctx), "migrating again is a no-op")

	other, err := postgres.New(db.Pool, postgres.Config{Schema: "ops"})
	require.NoError(t, err)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- other.Migrate(ctx) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	var versions int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM ops.nudge_schema_migrations WHERE component = 'deadletter'`).Scan(&versions))
	require.Equal(t, 2, versions)
}

func TestMissingTableSaysToMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, postgres.Config{})
	require.NoError(t, err)
	_, err = s.Add(context.Background(), deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base()))
	require.ErrorIs(t, err, deadletter.ErrNotMigrated)
	require.ErrorContains(t, err, "Store.Migrate) or `nudge migrate` first")
	_, err = s.List(context.Background(), deadletter.Filter{})
	require.ErrorIs(t, err, deadletter.ErrNotMigrated)
	_, err = s.Get(context.Background(), 1)
	require.ErrorIs(t, err, deadletter.ErrNotMigrated)
	require.ErrorIs(t, s.Resolve(context.Background(), 1, "ann", "", time.Time{}), deadletter.ErrNotMigrated)
}

func TestTxWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t, postgres.Config{})
	base := deadlettertest.Base()

	// Rolled back: nothing stays.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	r, err := s.AddTx(ctx, tx, deadlettertest.EventEntry("tickets", uuid.New(), base))
	require.NoError(t, err)
	require.Equal(t, 1, r.Count)
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, deadlettertest.All(t, s))

	// Committed: the record is there, and the other Tx twins act in the caller's transaction.
	kept := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, fn))
	}
	event := uuid.New()
	kept(func(tx pgx.Tx) error {
		r, err = s.AddTx(ctx, tx, deadlettertest.EventEntry("tickets", event, base))
		return err
	})
	require.Equal(t, r, get(t, s, r.ID))

	rolledBack := func(fn func(tx pgx.Tx)) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		fn(tx)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, r, get(t, s, r.ID), "a rolled-back write leaves the record as it was")
	}
	rolledBack(func(tx pgx.Tx) {
		n, err := s.MarkReplayedTx(ctx, tx, []int64{r.ID}, "ann", base)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
	rolledBack(func(tx pgx.Tx) { require.NoError(t, s.ResolveTx(ctx, tx, r.ID, "ann", "", base)) })
	rolledBack(func(tx pgx.Tx) {
		n, err := s.PurgeTx(ctx, tx, deadletter.PurgeOptions{IncludeUnresolved: true})
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
	rolledBack(func(tx pgx.Tx) {
		_, err := s.AddTx(ctx, tx, deadlettertest.EventEntry("tickets", event, base))
		require.NoError(t, err)
	})

	_, err = s.AddTx(ctx, nil, deadlettertest.EventEntry("tickets", event, base))
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "use Add")
	_, err = s.MarkReplayedTx(ctx, nil, []int64{r.ID}, "ann", base)
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorIs(t, s.ResolveTx(ctx, nil, r.ID, "ann", "", base), deadletter.ErrInvalidInput)
	_, err = s.PurgeTx(ctx, nil, deadletter.PurgeOptions{})
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
}

// An Add of an event whose record another transaction is writing waits for that transaction,
// then folds into its record.
func TestAddWaitsForAnOpenAddTxAndFolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t, postgres.Config{})
	event := uuid.New()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	first, err := s.AddTx(ctx, tx, deadlettertest.EventEntry("tickets", event, deadlettertest.Base()))
	require.NoError(t, err)

	type result struct {
		r   deadletter.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.Add(ctx, deadlettertest.EventEntry("tickets", event, deadlettertest.Base()))
		done <- result{r, err}
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, testwait.For(time.Minute), 5*time.Millisecond, "the second Add waits for the open transaction")
	require.NoError(t, tx.Commit(ctx))

	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, first.ID, res.r.ID)
	require.Equal(t, 2, res.r.Count)
	require.Len(t, deadlettertest.All(t, s), 1)
}

// Operators read the table with plain SQL; the table refuses rows that break its rules.
func TestPlainSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t, postgres.Config{})
	event := uuid.New()
	e := deadlettertest.EventEntry("tickets", event, deadlettertest.Base())
	r := add(t, s, e)
	add(t, s, deadlettertest.InvalidEntry("tickets", "msg-1", deadlettertest.Base()))

	var (
		id                            int64
		projection, status, eventType string
		streamID                      string
		count, attempts               int
		lastFailedAt                  time.Time
		eventID                       uuid.UUID
		errText, pos, marker, payload string
		foldKey                       string
	)
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT id, projection, status, count, attempts, last_failed_at,
		       failing_event_type, failing_event_id, failing_stream_id, error,
		       failing_transaction_id::text || '/' || failing_global_position,
		       metadata->>'nudge_trigger', convert_from(payload, 'UTF8'), fold_key
		FROM nudge_dead_letters
		WHERE status <> 'resolved' AND failing_event_id IS NOT NULL
		ORDER BY projection, id`).Scan(&id, &projection, &status, &count, &attempts, &lastFailedAt,
		&eventType, &eventID, &streamID, &errText, &pos, &marker, &payload, &foldKey))
	require.Equal(t, r.ID, id)
	require.Equal(t, "tickets", projection)
	require.Equal(t, "failed", status)
	require.Equal(t, 1, count)
	require.Equal(t, 3, attempts)
	require.True(t, lastFailedAt.Equal(deadlettertest.Base()))
	require.Equal(t, "TicketWasRegistered", eventType)
	require.Equal(t, event, eventID)
	require.Equal(t, e.FailingEvent.StreamID, streamID)
	require.Equal(t, e.Error, errText)
	require.Equal(t, e.FailingEvent.Position.String(), pos, "the position reads like eventstore.Position.String")
	require.Equal(t, "1", marker)
	require.Equal(t, string(e.Payload), payload)
	require.Equal(t, event.String(), foldKey)

	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT fold_key FROM nudge_dead_letters WHERE failing_event_id IS NULL`).Scan(&foldKey))
	require.Equal(t, "message:msg-1", foldKey)

	_, err := db.Pool.Exec(ctx, `UPDATE nudge_dead_letters SET status = 'done' WHERE id = $1`, r.ID)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23514", pgErr.Code, "status is checked")
	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_dead_letters (projection, message_uuid, payload, error,
		failing_event_id, attempts, first_failed_at, last_failed_at) VALUES ('tickets', 'x', '', '', $1, 1, now(), now())`, event)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code, "one open record per projection and event")
}

func add(t testing.TB, s deadletter.Store, e deadletter.Entry) deadletter.Record {
	t.Helper()
	r, err := s.Add(context.Background(), e)
	require.NoError(t, err)
	return r
}

func get(t testing.TB, s deadletter.Store, id int64) deadletter.Record {
	t.Helper()
	r, err := s.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}
