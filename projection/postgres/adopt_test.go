package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// plainV1 is version 1 of stream_last as code that predates versions writes it: no
// Config.Tables, its own table under the name readers query, with an index, an upsert and
// hooks that change the table (DDL in init, TRUNCATE in reset).
func plainV1(t *testing.T) *projection.Projection {
	t.Helper()
	return plainV1With(t, nil)
}

// plainV1With is plainV1 whose handler calls *after (when set) once it has written its row.
func plainV1With(t *testing.T, after *atomic.Pointer[func()]) *projection.Projection {
	t.Helper()
	p, err := projection.New("stream_last", projection.Config{
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS stream_last (stream_id text PRIMARY KEY, version bigint NOT NULL);
				CREATE INDEX IF NOT EXISTS stream_last_version ON stream_last (version)`)
			return err
		},
		ResetFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `TRUNCATE stream_last`)
			return err
		},
	}, projection.On("Appended", func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
		_, err := tx.Exec(ctx, `INSERT INTO stream_last (stream_id, version) VALUES ($1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version`, e.StreamID, e.StreamVersion)
		if after != nil {
			if fn := after.Load(); fn != nil {
				(*fn)()
			}
		}
		return err
	}))
	require.NoError(t, err)
	return p
}

// relkind returns the kind of the relation name ("" when there is none).
func relkind(ctx context.Context, t *testing.T, e env, name string) string {
	t.Helper()
	var kind *string
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))`, name).Scan(&kind))
	if kind == nil {
		return ""
	}
	return *kind
}

// TestAdoptPlainVersionOneTable: version 2 with Config.Tables is deployed beside a version 1
// that wrote its plain table under the stable name. Registering version 2 adopts the table
// (renamed to stream_last_v1, its index with it; stream_last a view of it) with nothing to do
// by hand; version 1's code keeps writing through the view until the cut-over; its hooks that
// need a table fail with an error that says why. Once version 2 took over, version 1's code is
// gone (the new runner has version 2 only): its table is dropped after version 2's RetireGrace.
func TestAdoptPlainVersionOneTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1 := plainV1(t)
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 20, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last"))

	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	v2 := lastV2(t, projection.Config{RetireGrace: time.Hour}, nil)
	neu, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), NowFunc: func() time.Time { return *now.Load() }}, v2)
	require.NoError(t, err)
	require.NoError(t, neu.Init(ctx))
	require.Equal(t, "v", relkind(ctx, t, e, "stream_last"), "the stable name is a view now")
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last_v1"), "version 1's table, renamed")
	require.Equal(t, "i", relkind(ctx, t, e, "stream_last_version"), "its index moved with it")
	var tables []string
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT tables FROM nudge_projection_versions WHERE projection = 'stream_last' AND version = 1`).Scan(&tables))
	require.Equal(t, []string{"stream_last"}, tables)
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 20, got, "readers see version 1's rows through the view")
	require.NoError(t, neu.Init(ctx), "a second start adopts nothing more")

	// Version 1's code writes through the view (INSERT … ON CONFLICT, UPDATE).
	appendSettled(ctx, t, e, 21, 30, false)
	_, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	got, err = readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 30, got)

	// What a view refuses fails with an error that says why, and changes nothing.
	for _, fail := range []func() error{
		func() error { return old.Init(ctx) },             // CREATE INDEX on the view
		func() error { return old.Reset(ctx, v1.Name()) }, // TRUNCATE of the view
	} {
		err := fail()
		require.ErrorContains(t, err, "refused on a view")
		require.ErrorContains(t, err, "renamed <table>_v1")
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr))
		require.Equal(t, "42809", pgErr.Code)
	}
	st, err := old.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State, "the refused reset changed nothing")

	// The cut-over replaces the view; version 1 is retired.
	res, err := neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	var cols int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'stream_last'`).Scan(&cols))
	require.Equal(t, 3, cols, "the view is version 2's")
	res, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)

	// Version 1's code is gone; version 2's runner drops its table after the grace.
	_, err = neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last_v1"), "kept within the grace")
	later := start.Add(2 * time.Hour)
	now.Store(&later)
	_, err = neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.Empty(t, relkind(ctx, t, e, "stream_last_v1"), "dropped after the grace")
	var dropped bool
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT dropped_at IS NOT NULL FROM nudge_projection_versions WHERE projection = 'stream_last' AND version = 1`).Scan(&dropped))
	require.True(t, dropped)
	got, err = readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 30, got)
}

// TestAdoptDropRetiredOnCommand: a runner that has only version 2 drops version 1's adopted
// table on command (Runner.DropRetired with version 1's unit name), not before it is retired.
func TestAdoptDropRetiredOnCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1 := plainV1(t)
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 5, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	v2 := lastV2(t, projection.Config{RetireGrace: -1}, nil)
	neu := runner(t, e.backend, v2)
	require.ErrorIs(t, neu.DropRetired(ctx, "stream_last"), projection.ErrNotRetired)
	require.ErrorIs(t, neu.DropRetired(ctx, "stream_last.v02"), projection.ErrUnknownProjection)
	res, err := neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	_, err = neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last_v1"), "a negative grace keeps it")
	require.NoError(t, neu.DropRetired(ctx, "stream_last"))
	require.Empty(t, relkind(ctx, t, e, "stream_last_v1"))
	require.NoError(t, neu.DropRetired(ctx, "stream_last"), "dropped once; again is a no-op")
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 5, got)
}

// TestAdoptRefusesOtherSchema: version 1's table found on the search path outside the first
// schema (where the versions' tables and views are created) is not adopted: the error says
// which schema to put first.
func TestAdoptRefusesOtherSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1 := plainV1(t)
	_ = runner(t, e.backend, v1)
	_, err := e.db.Pool.Exec(ctx, `CREATE SCHEMA rm; ALTER DATABASE `+pgx.Identifier{e.db.Name}.Sanitize()+` SET search_path = rm, public`)
	require.NoError(t, err)
	e.db.Pool.Reset() // new connections take the database's search_path
	v2 := lastV2(t, projection.Config{}, nil)
	r, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t)}, v2)
	require.NoError(t, err)
	err = r.Init(ctx)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, `is in schema "public", but the versions' tables and views are created in "rm"`)
	require.Equal(t, "r", relkind(ctx, t, e, "public.stream_last"), "nothing changed")
}

// TestAdoptRetiredVersionOneDropsItsTable: a version 1 without a DeleteFunc whose table was
// adopted, still run by an old worker after the cut-over, drops that table (stream_last_v1)
// itself once its RetireGrace has passed.
func TestAdoptRetiredVersionOneDropsItsTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	v1 := plainV1(t)
	old, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), NowFunc: func() time.Time { return *now.Load() }}, v1)
	require.NoError(t, err)
	require.NoError(t, old.Init(ctx))
	appendSettled(ctx, t, e, 1, 5, false)
	_, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	v2 := lastV2(t, projection.Config{RetireGrace: -1}, nil)
	neu := runner(t, e.backend, v2)
	res, err := neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)

	res, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last_v1"), "kept within the grace")
	later := start.Add(2 * time.Hour)
	now.Store(&later)
	_, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.Empty(t, relkind(ctx, t, e, "stream_last_v1"), "dropped after the grace, without a DeleteFunc")
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 5, got)
}

// TestAdoptWaitsForVersionOneBatch: the adoption takes version 1's lock, so it waits for a
// version 1 batch in flight (which writes the plain table) and renames the table only after
// that batch committed: the batch's row is in stream_last_v1, seen through the view.
func TestAdoptWaitsForVersionOneBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	var after atomic.Pointer[func()]
	v1 := plainV1With(t, &after)
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 5, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	inBatch, release := make(chan struct{}), make(chan struct{})
	block := func() {
		close(inBatch)
		<-release
	}
	after.Store(&block)
	appendSettled(ctx, t, e, 6, 6, false)
	caughtUp := make(chan error, 1)
	go func() {
		_, err := old.CatchUp(ctx, v1.Name())
		caughtUp <- err
	}()
	<-inBatch
	after.Store(nil)

	v2 := lastV2(t, projection.Config{}, nil)
	neu, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t)}, v2)
	require.NoError(t, err)
	registered := make(chan error, 1)
	go func() { registered <- neu.Init(ctx) }()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting))
		return waiting > 0
	}, testwait.For(time.Minute), 10*time.Millisecond, "version 2's registration waits for version 1's lock")
	select {
	case err := <-registered:
		t.Fatalf("version 2 registered while a version 1 batch was in flight: %v", err)
	default:
	}
	require.Equal(t, "r", relkind(ctx, t, e, "stream_last"), "not adopted while version 1's batch writes it")

	close(release)
	require.NoError(t, <-caughtUp)
	require.NoError(t, <-registered)
	require.Equal(t, "v", relkind(ctx, t, e, "stream_last"))
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 6, got, "the batch's row is in the adopted table")
}
