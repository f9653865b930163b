package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// The versioned read model of the kill tests: a row per event k with the times it was applied.
// Version 2's table adds whether the event was history (replay) when it was applied, so the
// cut-over must drop and create the view.
const (
	killModel = "kill_model"
	// killBatch is both versions' batch size: version 2's history takes many batches.
	killBatch = 10
)

// The environment of a version 2 worker process: this test binary run again with
// -test.run=^TestVersionKillProcess$.
const (
	// killURLEnv is the database URL; TestVersionKillProcess does nothing unless it is set.
	killURLEnv = "NUDGE_VERSION_KILL_POSTGRES_URL"
	// killHoldEnv is where the worker holds (see killHold), until it is killed; empty: nowhere.
	killHoldEnv = "NUDGE_VERSION_KILL_HOLD"
)

// killHold is where a version 2 worker holds, printing "holding", until the test kills it.
type killHold struct {
	// name is the subtest's name and the value of killHoldEnv.
	name string
	// event is the event (k) whose handling holds; 0 for none.
	event int
	// activate holds in version 2's ActivateFunc: inside the cut-over's transaction, after its
	// batches ran and the views were replaced, before the version records flip and it commits.
	activate bool
	// committed is how many events version 2 has committed when it holds.
	committed int
	// locksBase: the held transaction holds the projection's lock (version 1's), so version
	// 1's batches wait for it; locksView: it replaced the views, so their readers wait.
	locksBase, locksView bool
}

// The kill points. Version 1 is at event 100 and events 101–105 are appended, not handled by
// it, when the worker starts.
var killHolds = []killHold{
	// In the middle of a history batch (51–60): handled 51–54, holds in 55.
	{name: "history-batch", event: 55, committed: 50},
	// In a batch claiming live events (after version 1's position): 101–102 handled, holds in
	// 103, holding version 1's lock too (taken without waiting).
	{name: "cut-over-batch", event: 103, committed: 100, locksBase: true},
	// In ActivateFunc: a batch claimed 101–105 and committed; the cut-over had nothing left to
	// handle and replaced the view; not committed.
	{name: "cut-over-hook", activate: true, committed: 105, locksBase: true, locksView: true},
}

// killModelVersion is version version (1 or 2) of the kill tests' projection. hold, if set,
// makes it hold there (version 2 only): it prints "holding" and waits until its stdin is closed
// (the parent never closes it: it kills the process), then exits.
func killModelVersion(t testing.TB, version int, hold *killHold, invocations *atomic.Int64) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	holdHere := func() {
		fmt.Println("holding")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3) // not reached: the parent kills the process first
	}
	columns := `k int PRIMARY KEY, times int NOT NULL`
	insert := func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+p.Table(killModel)+` (k, times) VALUES ($1, 1)
			ON CONFLICT (k) DO UPDATE SET times = `+p.Table(killModel)+`.times + 1`, e.Data.K)
		return err
	}
	if version == 2 {
		columns += `, replay bool NOT NULL`
		insert = func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+p.Table(killModel)+` (k, times, replay) VALUES ($1, 1, $2)
				ON CONFLICT (k) DO UPDATE SET times = `+p.Table(killModel)+`.times + 1`, e.Data.K, e.Replay)
			return err
		}
	}
	cfg := projection.Config{
		Version:   version,
		BatchSize: killBatch,
		Tables:    []string{killModel},
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table(killModel)+` (`+columns+`)`)
			return err
		},
	}
	if hold != nil && hold.activate {
		cfg.ActivateFunc = func(context.Context, projection.HookParams) error {
			holdHere()
			return nil
		}
	}
	p, err := projection.New("killed", cfg, projection.On("Appended", func(ctx context.Context, tx pgx.Tx, e projection.Event[appended]) error {
		if invocations != nil {
			invocations.Add(1)
		}
		if hold != nil && e.Data.K == hold.event {
			holdHere()
		}
		return insert(ctx, tx, e)
	}))
	require.NoError(t, err)
	return p
}

// TestVersionKillProcess is a worker of version 2 only, a newer deploy, when the test binary is
// run again by TestVersionBuildSurvivesSIGKILL; in a normal test run it returns at once. It
// prints "ready" after Init, "committed=<events>" after each batch it committed, catches
// version 2 up until it cuts over, then prints "activated" and "invocations=<n>" (how often its
// handler ran) and exits 0. With killHoldEnv set it holds there instead, until it is killed.
func TestVersionKillProcess(t *testing.T) {
	dbURL := os.Getenv(killURLEnv)
	if dbURL == "" {
		return
	}
	var hold *killHold
	if name := os.Getenv(killHoldEnv); name != "" {
		for i := range killHolds {
			if killHolds[i].name == name {
				hold = &killHolds[i]
			}
		}
		if hold == nil {
			workerFail(t, fmt.Errorf("%s=%q: no such kill point", killHoldEnv, name))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(workerTimeout))
	defer cancel()
	backend := childBackend(t, ctx, dbURL)
	var invocations atomic.Int64
	v2 := killModelVersion(t, 2, hold, &invocations)
	r, err := projection.NewRunner(backend, projection.RunnerConfig{OnBatch: printCommitted}, v2)
	if err != nil {
		workerFail(t, err)
	}
	if err := r.Init(ctx); err != nil {
		workerFail(t, err)
	}
	fmt.Println("ready")
	for {
		res, err := r.CatchUp(ctx, v2.Name())
		if err != nil {
			workerFail(t, fmt.Errorf("after %d invocations: %w", invocations.Load(), err))
		}
		if res.Activated {
			break
		}
	}
	fmt.Println("activated")
	fmt.Printf("invocations=%d\n", invocations.Load())
}

// TestVersionBuildSurvivesSIGKILL: version 2 is built beside an active version 1 by a worker
// process that is SIGKILLed while it holds at a chosen point (it reports it, and waits there
// until the kill: no timing decides where the kill lands): in the middle of a history batch,
// in a cut-over batch that handles live events, and in the cut-over's hook after the view was
// replaced. After each kill version 1 is still active and serving: the view is still version
// 1's and answers its whole model (also to a reader that queried during the hold, and waited),
// its batches (one of them waited during the hold too) and the following ones go on; version 2
// is building, running, at the position of its last committed batch. A restarted worker resumes
// version 2 from there (it handles only the events after it) and cuts over: the view then shows
// version 2's model, every event applied once, the history as replay and only the events version
// 1 had not handled as live; version 1 is retired.
func TestVersionBuildSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	for _, hold := range killHolds {
		t.Run(hold.name, func(t *testing.T) {
			t.Parallel()
			testVersionKill(t, hold)
		})
	}
}

func testVersionKill(t *testing.T, hold killHold) {
	e := newEnv(t)
	ctx := testwait.Context(t, 5*time.Minute)
	v1 := killModelVersion(t, 1, nil, nil)
	old := runner(t, e.backend, v1) // the old worker, in this process
	appendSettled(ctx, t, e, 1, 100, false)
	res, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, 100, res.Events)
	appendSettled(ctx, t, e, 101, 105, false) // version 1 has not handled these yet

	v2 := killModelVersion(t, 2, nil, nil)
	status := runner(t, e.backend, v2) // registers version 2 (building); only reads its status
	before, err := status.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, before.VersionState)
	dbURL := workerURL(t, e.db.URL)

	started := time.Now()
	c := startTestProcess(t, ctx, "TestVersionKillProcess", []string{killURLEnv + "=" + dbURL, killHoldEnv + "=" + hold.name})
	select {
	case <-c.holding:
	case <-c.done:
		t.Fatalf("the worker ended before it held\n%s", c.output())
	case <-ctx.Done():
		t.Fatalf("the worker did not hold in time\n%s", c.output())
	}
	heldAfter := time.Since(started)

	// While it holds: a reader of the view, then a catch-up of version 1. Each waits for the
	// held transaction if it holds the lock it needs (the view's, the projection's), else it
	// is done before the kill.
	type read struct {
		n   int
		err error
	}
	reader, live := make(chan read, 1), make(chan read, 1)
	go func() {
		n, err := readKillModel(ctx, e.db.Pool, "")
		reader <- read{n, err}
	}()
	if !hold.locksView {
		got := <-reader
		require.NoError(t, got.err)
		require.Equal(t, 100, got.n, "the reader saw version 1's whole model while version 2's worker held")
	}
	go func() {
		res, err := old.CatchUp(ctx, v1.Name())
		live <- read{res.Events, err}
	}()
	if !hold.locksBase {
		got := <-live
		require.NoError(t, got.err)
		require.Equal(t, 5, got.n, "version 1's batches went on while version 2's worker held")
	}
	waitLockWaiters(t, e, hold)
	c.kill(t)
	require.True(t, c.killed(), c.output())
	waitSessionsGone(t, e)
	killedAfter := time.Since(started)

	// Version 1 serves on: what waited for the held transaction goes on.
	if hold.locksView {
		got := <-reader
		require.NoError(t, got.err)
		require.Contains(t, []int{100, 105}, got.n, "the reader that waited saw version 1's whole model (before or after its batch)")
	}
	if hold.locksBase {
		got := <-live
		require.NoError(t, got.err)
		require.Equal(t, 5, got.n, "version 1's batch waited for the held cut-over, then handled 101–105")
	}
	_, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	n, err := readKillModel(ctx, e.db.Pool, "")
	require.NoError(t, err)
	require.Equal(t, 105, n)
	require.Equal(t, 2, viewColumns(t, e), "the view is version 1's")
	v1st, err := old.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, v1st.VersionState)
	require.Equal(t, projection.StateRunning, v1st.State)

	// Version 2 stays where its last committed batch left it.
	st, err := status.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	require.Equal(t, projection.StateRunning, st.State, st.LastError)
	require.Equal(t, int64(hold.committed), st.EventsProcessed)
	at, err := e.store.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 200})
	require.NoError(t, err)
	require.Equal(t, at[hold.committed-1].Position, st.Position, "version 2's position is its last committed batch's")
	n, err = readKillModel(ctx, e.db.Pool, "_v2")
	require.NoError(t, err, "version 2's table holds the model of its committed events")
	require.Equal(t, hold.committed, n)

	// More events: version 1 handles up to 120; 121–125 are live for version 2's cut-over.
	appendSettled(ctx, t, e, 106, 120, false)
	_, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	n, err = readKillModel(ctx, e.db.Pool, "")
	require.NoError(t, err)
	require.Equal(t, 120, n)
	appendSettled(ctx, t, e, 121, 125, false)

	// The restarted worker resumes version 2 from its own position and cuts over.
	restarted := startTestProcess(t, ctx, "TestVersionKillProcess", []string{killURLEnv + "=" + dbURL})
	invocations := restarted.finish(t, ctx)
	require.Contains(t, restarted.lines, "activated", restarted.output())
	require.Equal(t, int64(125-hold.committed), invocations, "the restarted worker handled only the events after version 2's position")
	n, err = readKillModel(ctx, e.db.Pool, "")
	require.NoError(t, err)
	require.Equal(t, 125, n, "the view shows version 2's model, every event once")
	require.Equal(t, 3, viewColumns(t, e), "the view is version 2's")
	var live2, replayed int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT replay), count(*) FILTER (WHERE replay) FROM kill_model`).Scan(&live2, &replayed))
	claimed := max(hold.committed-100, 0) // 101–105, when a batch claimed them before the kill
	require.Equal(t, 5+claimed, live2, "only 121–125, which version 1 never handled, and the events version 2 claimed were live for version 2")
	require.Equal(t, 120-claimed, replayed)
	st, err = status.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, st.VersionState)
	res, err = old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.Zero(t, res.Events)
	t.Logf("%s: held after %s, killed and its session gone after %s; the restarted worker handled %d events and cut over",
		hold.name, heldAfter.Round(time.Millisecond), killedAfter.Round(time.Millisecond), invocations)
}

// waitLockWaiters waits until this process's reader and version 1 batch wait for the locks the
// held worker's transaction has: the projection's lock with locksBase, the view's with
// locksView.
func waitLockWaiters(t *testing.T, e env, hold killHold) {
	t.Helper()
	var advisory, relation int
	require.Eventually(t, func() bool {
		require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE locktype = 'advisory'),
			count(*) FILTER (WHERE locktype = 'relation') FROM pg_locks
			WHERE NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&advisory, &relation))
		return (advisory > 0) == hold.locksBase && (relation > 0) == hold.locksView
	}, testwait.For(30*time.Second), 5*time.Millisecond, "waiting for locks: %d advisory, %d relation", advisory, relation)
}

// readKillModel reads the kill model through the view (suffix "") or a version's table
// ("_v2") and returns n when it holds exactly events 1..n, each applied once.
func readKillModel(ctx context.Context, db *pgxpool.Pool, suffix string) (int, error) {
	var rows, maxK, notOnce int
	err := db.QueryRow(ctx, `SELECT count(*), coalesce(max(k), 0), count(*) FILTER (WHERE times <> 1) FROM `+
		pgx.Identifier{killModel + suffix}.Sanitize()).Scan(&rows, &maxK, &notOnce)
	switch {
	case err != nil:
		return 0, err
	case notOnce > 0:
		return rows, fmt.Errorf("%d events applied more than once", notOnce)
	case rows != maxK:
		return rows, errors.New(strconv.Itoa(rows) + " rows, not events 1.." + strconv.Itoa(maxK))
	}
	return rows, nil
}

// viewColumns counts the columns of the view kill_model: 2 for version 1's, 3 for version 2's.
func viewColumns(t *testing.T, e env) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.columns WHERE table_name = $1`, killModel).Scan(&n))
	return n
}
