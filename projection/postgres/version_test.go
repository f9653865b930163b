package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	pgdriver "github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// The versioned read model of these tests: one row per stream with the stream's last version.
// Version 1's table is (stream_id, version); version 2's adds a label and reorders the columns,
// so the cut-over must drop and create the view (OR REPLACE refuses). The columns readers select
// keep their types: a changed type fails a reader's cached prepared statement once (see the README).
const (
	streamCount = 7
	lastTable   = "stream_last"
)

type appended struct {
	K      int  `json:"k"`
	Poison bool `json:"poison,omitempty"`
}

// lastV1 is version 1 of the model.
func lastV1(t *testing.T, cfg projection.Config) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	cfg.Tables = []string{lastTable}
	cfg.InitFunc = func(ctx context.Context, hp projection.HookParams) error {
		_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table(lastTable)+` (stream_id text PRIMARY KEY, version bigint NOT NULL)`)
		return err
	}
	cfg.DeleteFunc = func(ctx context.Context, hp projection.HookParams) error {
		_, err := hp.Tx.Exec(ctx, `DROP TABLE IF EXISTS `+p.Table(lastTable))
		return err
	}
	p, err := projection.New("stream_last", cfg, projection.On("Appended", func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+p.Table(lastTable)+` (stream_id, version) VALUES ($1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version`, e.StreamID, e.StreamVersion)
		return err
	}))
	require.NoError(t, err)
	return p
}

// lastV2 is version 2 of the model; fail, when set, runs first for each event, and the handler
// fails with what it returns.
func lastV2(t *testing.T, cfg projection.Config, fail func(ctx context.Context, e projection.Event[appended]) error) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	cfg.Version = 2
	cfg.Tables = []string{lastTable}
	cfg.InitFunc = func(ctx context.Context, hp projection.HookParams) error {
		_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table(lastTable)+` (stream_id text PRIMARY KEY, label text NOT NULL, version bigint NOT NULL)`)
		return err
	}
	p, err := projection.New("stream_last", cfg, projection.On("Appended", func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
		if fail != nil {
			if err := fail(ctx, e); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+p.Table(lastTable)+` (stream_id, label, version) VALUES ($1, $2, $3)
			ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version, label = EXCLUDED.label`,
			e.StreamID, fmt.Sprintf("v%d", e.StreamVersion), e.StreamVersion)
		return err
	}))
	require.NoError(t, err)
	return p
}

// appendOne appends event k, one at a time, to stream k mod streamCount: the store's read order
// is then the order of k, and the model of the first n events is checkable.
func appendOne(ctx context.Context, e env, k int, poison bool) (eventstore.Position, error) {
	data, err := eventstore.NewEventData("Appended", appended{K: k, Poison: poison})
	if err != nil {
		return eventstore.Position{}, err
	}
	res, err := e.store.Append(ctx, streamOf(k), eventstore.Any, data)
	if err != nil {
		return eventstore.Position{}, err
	}
	return res.Events[0].Position, nil
}

// appendSettled appends events from to to (appendOne) and waits until the store can read them
// all.
func appendSettled(ctx context.Context, t *testing.T, e env, from, to int, poison bool) {
	t.Helper()
	var last eventstore.Position
	for k := from; k <= to; k++ {
		var err error
		last, err = appendOne(ctx, e, k, poison)
		require.NoError(t, err)
	}
	storetest.Settle(t, e.store, last)
}

func streamOf(k int) string { return fmt.Sprintf("s-%d", k%streamCount) }

// modelOf is the model after the first n events: each stream's last version.
func modelOf(n int) map[string]int64 {
	m := make(map[string]int64)
	for k := 1; k <= n; k++ {
		m[streamOf(k)]++
	}
	return m
}

// readModel reads the stable view and returns the rows and the prefix they are the model of,
// or an error saying how they are not the model of any prefix.
func readModel(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	rows, err := pool.Query(ctx, `SELECT stream_id, version FROM stream_last`)
	if err != nil {
		return 0, err
	}
	got := make(map[string]int64)
	n := 0
	for rows.Next() {
		var (
			id string
			v  int64
		)
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return 0, err
		}
		got[id], n = v, n+int(v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	want := modelOf(n)
	if len(want) != len(got) {
		return n, fmt.Errorf("read %v: not the model of the first %d events %v", got, n, want)
	}
	for id, v := range want {
		if got[id] != v {
			return n, fmt.Errorf("read %v: not the model of the first %d events %v", got, n, want)
		}
	}
	return n, nil
}

// TestBlueGreenReaderSeesWholeModels: version 2 is built beside version 1 (an older worker's
// runner) while events are appended without pause, and cuts over by itself. A reader of the
// stable view checks every answer during the whole build and the cut-over: it is always the
// whole model of some prefix of the log, never an older prefix than the answer before (no
// empty, partial, mixed or stale model). After the cut-over version 1's batches do nothing.
func TestBlueGreenReaderSeesWholeModels(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1 := lastV1(t, projection.Config{})
	old := runner(t, e.backend, v1)
	n := 200
	appendSettled(ctx, t, e, 1, n, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 200, got)

	var (
		stop     = make(chan struct{})
		flipped  = make(chan struct{})
		wg       sync.WaitGroup
		reads    atomic.Int64
		after    atomic.Int64 // reads after the cut-over
		appendsN atomic.Int64
		lastPos  atomic.Pointer[eventstore.Position]
		failure  = make(chan error, 4)
		v1Nudge  = make(chan struct{}, 1)
		v2Nudge  = make(chan struct{}, 1)
	)
	appendsN.Store(int64(n))
	fail := func(err error) {
		select {
		case failure <- err:
		default:
		}
	}
	// The appender: one event at a time, nudging both versions' catch-ups.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := n + 1; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			pos, err := appendOne(ctx, e, k, false)
			if err != nil {
				fail(fmt.Errorf("append %d: %w", k, err))
				return
			}
			lastPos.Store(&pos)
			appendsN.Store(int64(k))
			for _, c := range []chan struct{}{v1Nudge, v2Nudge} {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		}
	}()
	// The live version 1, in the old worker.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-v1Nudge:
			}
			if _, err := old.CatchUp(ctx, v1.Name()); err != nil {
				fail(fmt.Errorf("version 1: %w", err))
				return
			}
		}
	}()
	// The reader.
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := readModel(ctx, e.db.Pool)
			if err != nil {
				fail(fmt.Errorf("reader: %w", err))
				return
			}
			if n < last {
				fail(fmt.Errorf("reader: the model went back from the first %d events to the first %d", last, n))
				return
			}
			last = n
			reads.Add(1)
			select {
			case <-flipped:
				after.Add(1)
			default:
			}
		}
	}()

	// The new worker, with version 2 only, small batches so that the build takes many; not
	// paced (the appends keep version 1 behind: pacing is the suite's VersionBuildPaced).
	v2 := lastV2(t, projection.Config{BatchSize: 25, BuildLagTarget: -1}, nil)
	require.Equal(t, "stream_last.v2", v2.Name())
	neu := runner(t, e.backend, v2)
	st, err := neu.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	require.Equal(t, 2, st.Version)
	require.Equal(t, 1, st.ActiveVersion)
	var held time.Duration
	for cutOver := false; !cutOver; {
		select {
		case err := <-failure:
			require.NoError(t, err)
		case <-v2Nudge:
		}
		res, err := neu.CatchUp(ctx, v2.Name())
		require.NoError(t, err)
		cutOver, held = res.Activated, res.CutOverHeld
	}
	close(flipped)
	t.Logf("cut-over held the locks for %s", held)
	readsAtFlip := reads.Load()
	require.Positive(t, readsAtFlip, "the reader read during the build")

	// Version 2 serves; version 1's batches find their version retired and do nothing.
	target := appendsN.Load() + 50
	for {
		select {
		case err := <-failure:
			require.NoError(t, err)
		case <-v2Nudge:
		}
		if _, err := neu.CatchUp(ctx, v2.Name()); err != nil {
			require.NoError(t, err)
		}
		if appendsN.Load() >= target && after.Load() > 0 {
			break
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-failure:
		require.NoError(t, err)
	default:
	}
	storetest.Settle(t, e.store, *lastPos.Load())
	_, err = neu.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	got, err = readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, int(appendsN.Load()), got, "the view shows version 2's model of every event")

	var v1Rows int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM stream_last_v1`).Scan(&v1Rows))
	res, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.Zero(t, res.Events)
	var v1After int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM stream_last_v1`).Scan(&v1After))
	require.Equal(t, v1Rows, v1After, "a retired version handles nothing")
	require.Less(t, v1Rows, got, "version 1 stopped before the head")

	st, err = neu.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, st.VersionState)
	require.Equal(t, 2, st.ActiveVersion)
	st, err = old.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionRetired, st.VersionState)
	require.False(t, st.RetiredAt.IsZero())
}

// sinkProjection is a version of a projection with an at-least-once side effect (a row per
// live event in sink, standing for an e-mail) that skips history (Event.Replay).
func sinkProjection(t *testing.T, version int, grace time.Duration) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	p, err := projection.New("mailer", projection.Config{
		Version:     version,
		BatchSize:   10,
		Tables:      []string{"mail_count"},
		RetireGrace: grace,
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table("mail_count")+` (n int NOT NULL);
				CREATE TABLE IF NOT EXISTS sink (event_id uuid NOT NULL, version int NOT NULL)`)
			return err
		},
		DeleteFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `DROP TABLE IF EXISTS `+p.Table("mail_count"))
			return err
		},
	}, projection.OnIdempotent("Appended", func(ctx context.Context, e projection.Event[appended]) error {
		if e.Replay != projection.Replaying(ctx) {
			return errors.New("Event.Replay and Replaying disagree")
		}
		if e.Replay {
			return nil
		}
		_, err := pool(ctx).Exec(ctx, `INSERT INTO sink (event_id, version) VALUES ($1, $2)`, e.ID, version)
		return err
	}))
	require.NoError(t, err)
	return p
}

type poolKey struct{}

func pool(ctx context.Context) *pgxpool.Pool { return ctx.Value(poolKey{}).(*pgxpool.Pool) }

// TestBlueGreenSideEffectsOnce: with one runner holding both versions, version 1 sends a mail
// for every event it handles live; version 2 replays history without sending, and sends for
// the events after version 1's position, from the cut-over on. Every event is mailed once.
func TestBlueGreenSideEffectsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.WithValue(testwait.Context(t, 3*time.Minute), poolKey{}, e.db.Pool)
	v1, v2 := sinkProjection(t, 1, -1), sinkProjection(t, 2, 0)
	r := runner(t, e.backend, v1)
	k := 0
	appendN := func(count int) {
		appendSettled(ctx, t, e, k+1, k+count, false)
		k += count
	}
	appendN(100)
	_, err := r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	both := runner(t, e.backend, v1, v2)
	require.Equal(t, []string{"mailer", "mailer.v2"}, both.Names())
	appendN(10)
	_, err = both.CatchUp(ctx, v1.Name()) // live: mailed by version 1
	require.NoError(t, err)
	appendN(10) // version 1 has not handled these: the cut-over does, live
	res, err := both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	appendN(15)
	res, err = both.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	_, err = both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)

	var total, distinct, byV1, byV2 int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id),
		count(*) FILTER (WHERE version = 1), count(*) FILTER (WHERE version = 2) FROM sink`).Scan(&total, &distinct, &byV1, &byV2))
	require.Equal(t, k, total, "every event mailed")
	require.Equal(t, k, distinct, "no event mailed twice")
	require.Equal(t, 110, byV1)
	require.Equal(t, 25, byV2, "version 2 mailed exactly the events after version 1 stopped")

	// Version 1 kept its read model (RetireGrace < 0) until dropped on command.
	var exists bool
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT to_regclass('mail_count_v1') IS NOT NULL`).Scan(&exists))
	require.True(t, exists)
	require.ErrorIs(t, both.DropRetired(ctx, v2.Name()), projection.ErrNotRetired)
	require.NoError(t, both.DropRetired(ctx, v1.Name()))
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT to_regclass('mail_count_v1') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
}

// TestBlueGreenRetireGraceDrops: a retired version's runner drops its read model by its
// DeleteFunc at its first catch-up once RetireGrace has passed, not before.
func TestBlueGreenRetireGraceDrops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1, v2 := lastV1(t, projection.Config{RetireGrace: time.Hour}), lastV2(t, projection.Config{}, nil)
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	r, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), NowFunc: func() time.Time { return *now.Load() }}, v1, v2)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	appendSettled(ctx, t, e, 1, 20, false)
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	res, err := r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)

	exists := func() bool {
		var ok bool
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT to_regclass('stream_last_v1') IS NOT NULL`).Scan(&ok))
		return ok
	}
	res, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.True(t, exists(), "kept within the grace")
	later := start.Add(2 * time.Hour)
	now.Store(&later)
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.False(t, exists(), "dropped after the grace")
	// Its status row stays, and its batches still do nothing; a restart does not create it again.
	require.NoError(t, r.Init(ctx))
	require.False(t, exists())
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 20, got)
}

// TestBlueGreenFlipOnlyWhenReady: no cut-over while version 2 is paused, nor while it fails
// (a poison event in the cut-over itself: recorded on version 2 only, version 1 serving on),
// nor when the cut-over's hook fails (everything stays as it was). Once fixed, it cuts over.
func TestBlueGreenFlipOnlyWhenReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	v1 := lastV1(t, projection.Config{})
	var (
		refuse      atomic.Bool
		hookRefuses atomic.Bool
	)
	refuse.Store(true)
	hookRefuses.Store(true)
	v2 := lastV2(t, projection.Config{ActivateFunc: func(context.Context, projection.HookParams) error {
		if hookRefuses.Load() {
			return errors.New("not now")
		}
		return nil
	}}, func(_ context.Context, ev projection.Event[appended]) error {
		if ev.Data.Poison && refuse.Load() {
			return errors.New("version 2 refuses this event")
		}
		return nil
	})
	r := runner(t, e.backend, v1, v2)
	appendSettled(ctx, t, e, 1, 30, false)
	_, err := r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	// Paused: nothing happens.
	require.NoError(t, r.Pause(ctx, v2.Name()))
	res, err := r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Paused)
	require.False(t, res.Activated)
	require.NoError(t, r.Resume(ctx, v2.Name()))

	// A poison event version 1 has not handled yet: the cut-over fails on it and rolls back.
	appendSettled(ctx, t, e, 31, 31, true)
	res, err = r.CatchUp(ctx, v2.Name())
	require.ErrorIs(t, err, projection.ErrHandler)
	require.False(t, res.Activated)
	st, err := r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	v1st, err := r.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, v1st.State, "the failure is version 2's only")
	require.Equal(t, projection.VersionActive, v1st.VersionState)
	_, err = r.CatchUp(ctx, v1.Name()) // version 1 serves on
	require.NoError(t, err)
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 31, got)

	// Fixed, but the cut-over's hook fails: everything stays as before.
	refuse.Store(false)
	appendSettled(ctx, t, e, 32, 32, false)
	res, err = r.CatchUp(ctx, v2.Name())
	require.ErrorContains(t, err, "not now")
	require.False(t, res.Activated)
	v1st, err = r.Status(ctx, v1.Name())
	require.NoError(t, err)
	after, err := r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, v1st.Position.Less(after.Position), "version 2 claimed event 32, past version 1's position, in a batch of its own; only the cut-over rolled back")
	require.Equal(t, projection.StateRunning, after.State, "event 31 is history now, and version 2 handled it")
	require.Equal(t, projection.VersionBuilding, after.VersionState)
	var v2Rows int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM stream_last_v2`).Scan(&v2Rows))
	require.Equal(t, 32, v2Rows, "version 2 holds what version 1 had handled and the event it claimed")
	var cols int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'stream_last'`).Scan(&cols))
	require.Equal(t, 2, cols, "the view is still version 1's")

	hookRefuses.Store(false)
	res, err = r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	st, err = r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Nil(t, st.FailingEvent)
	got, err = readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 32, got)
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'stream_last'`).Scan(&cols))
	require.Equal(t, 3, cols, "the view is version 2's")
}

// TestVersionOneUnchanged: a projection without a version keeps its name as its unit, its
// status row and its tables; it is version 1 and active. A version 1 row written by code that
// predates versions (no version record) is taken as the active version when version 2 comes.
func TestVersionOneUnchanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	p, err := projection.New("plain", projection.Config{}, projection.OnIdempotent("Appended", func(context.Context, projection.Event[appended]) error { return nil }))
	require.NoError(t, err)
	require.Equal(t, "plain", p.Name())
	require.Equal(t, 1, p.Version())
	r := runner(t, e.backend, p)
	appendSettled(ctx, t, e, 1, 1, false)
	res, err := r.CatchUp(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, 1, res.Events)
	require.False(t, res.Activated)
	st, err := r.Status(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, "plain", st.Name)
	require.Equal(t, 1, st.Version)
	require.Equal(t, 1, st.ActiveVersion)
	require.Equal(t, projection.VersionActive, st.VersionState)
	var rows int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM nudge_projections WHERE name = 'plain' AND global_position > 0`).Scan(&rows))
	require.Equal(t, 1, rows)

	// A row from before versions: version 2 builds beside it, then takes over.
	_, err = e.db.Pool.Exec(ctx, `DELETE FROM nudge_projection_versions WHERE projection = 'plain'`)
	require.NoError(t, err)
	p2, err := projection.New("plain", projection.Config{Version: 2}, projection.OnIdempotent("Appended", func(context.Context, projection.Event[appended]) error { return nil }))
	require.NoError(t, err)
	r2 := runner(t, e.backend, p2)
	st, err = r2.Status(ctx, "plain.v2")
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	res, err = r2.CatchUp(ctx, "plain.v2")
	require.NoError(t, err)
	require.True(t, res.Activated)
	res, err = r.CatchUp(ctx, "plain")
	require.NoError(t, err)
	require.True(t, res.Retired)
}

// TestBlueGreenCutOverAllOrNothing: a dead letter of version 2 still to replay or resolve
// holds the cut-over back; a cut-over whose connection goes away in the middle (the context
// ends inside it, as when the process dies) leaves version 1 active, its view and version 2's
// position as they were; the next catch-up cuts over.
func TestBlueGreenCutOverAllOrNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	require.NoError(t, pgdriver.Migrate(ctx, e.db.Pool, "", pgdriver.ComponentDeadLetters))
	var die atomic.Pointer[context.CancelFunc]
	v1 := lastV1(t, projection.Config{})
	v2 := lastV2(t, projection.Config{ActivateFunc: func(ctx context.Context, _ projection.HookParams) error {
		if cancel := die.Load(); cancel != nil {
			(*cancel)()
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}, nil)
	r := runner(t, e.backend, v1, v2)
	appendSettled(ctx, t, e, 1, 20, false)
	_, err := r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	_, err = e.db.Pool.Exec(ctx, `INSERT INTO nudge_dead_letters (projection, message_uuid, payload, error, attempts, first_failed_at, last_failed_at)
		VALUES ($1, 'm-1', '\x00', 'handler failed', 5, now(), now())`, v2.Name())
	require.NoError(t, err)
	res, err := r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.False(t, res.Activated, "a dead letter to replay or resolve holds the cut-over back")
	_, err = e.db.Pool.Exec(ctx, `UPDATE nudge_dead_letters SET status = 'resolved'`)
	require.NoError(t, err)

	appendSettled(ctx, t, e, 21, 25, false) // claimed by version 2's batches, before its cut-over
	dying, cancel := context.WithCancel(ctx)
	die.Store(&cancel)
	res, err = r.CatchUp(dying, v2.Name())
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, res.Activated)
	after, err := r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, after.VersionState)
	v1st, err := r.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, v1st.VersionState)
	require.True(t, v1st.Position.Less(after.Position), "version 2 claimed events 21-25 in batches of its own, which stay")
	var v2Rows int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(version), 0) FROM stream_last_v2`).Scan(&v2Rows))
	require.Equal(t, 25, v2Rows)
	var cols int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'stream_last'`).Scan(&cols))
	require.Equal(t, 2, cols, "the view is still version 1's")

	die.Store(nil)
	res, err = r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 25, got)
}

// TestCutOverPastItsBatchTimeout: a cut-over that its BatchTimeout ends while a handler runs
// (the handler returns the deadline's error) rolls back and returns an error matching
// ErrBatchTimeout, as a batch does, and context.DeadlineExceeded: it is not the event's fault,
// so nothing is recorded as the projection's failure. The next catch-up cuts over.
//
// The event the cut-over handles is appended, and handled by version 1, right after version
// 2's last batch of history commits (RunnerConfig.OnBatch), before the cut-over reads: only the
// cut-over, holding both versions' locks, handles it.
func TestCutOverPastItsBatchTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 2*time.Minute)
	const timeout = 2 * time.Second
	var stall atomic.Bool
	stall.Store(true)
	v1 := lastV1(t, projection.Config{})
	v2 := lastV2(t, projection.Config{BatchTimeout: timeout, MaxBatchDuration: timeout / 2}, func(ctx context.Context, ev projection.Event[appended]) error {
		if ev.Data.K == 21 && stall.Load() {
			<-ctx.Done() // the cut-over's deadline
			return ctx.Err()
		}
		return nil
	})
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 20, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	var appended atomic.Bool
	neu, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: func(b projection.BatchReport) {
		if b.Projection != v2.Name() || b.Err != nil || appended.Load() {
			return
		}
		appended.Store(true)
		appendSettled(ctx, t, e, 21, 21, false)
		_, err := old.CatchUp(ctx, v1.Name())
		require.NoError(t, err)
	}}, v2)
	require.NoError(t, err)
	require.NoError(t, neu.Init(ctx))

	var res projection.Result
	for !appended.Load() { // a batch of history slowed past its BatchTimeout by a busy machine is retried
		res, err = neu.CatchUp(ctx, v2.Name())
		require.True(t, appended.Load() || errors.Is(err, projection.ErrBatchTimeout), "%v", err)
		require.NoError(t, ctx.Err())
	}
	require.ErrorIs(t, err, projection.ErrBatchTimeout, "the cut-over's deadline")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, projection.ErrHandler, "a deadline is not the event's fault")
	require.ErrorContains(t, err, "cut-over to version 2")
	require.False(t, res.Activated)
	st, err := neu.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	require.Equal(t, projection.StateRunning, st.State, "a deadline is not the projection's failure")
	require.Zero(t, st.Attempts)
	require.Empty(t, st.LastError)

	stall.Store(false)
	for !res.Activated { // as above: a cut-over slowed past its deadline is retried
		res, err = neu.CatchUp(ctx, v2.Name())
		if !errors.Is(err, projection.ErrBatchTimeout) {
			require.NoError(t, err)
		}
		require.NoError(t, ctx.Err())
	}
	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, 21, got)
}
