// Package projectiontest is the suite every projection.Backend passes. It drives the runner
// through catch-up, failures, rebuilds, pauses and concurrent workers with OnIdempotent
// handlers, which run on every backend.
package projectiontest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// Env is a fresh event store and a backend reading from it, for one subtest.
type Env struct {
	Store   eventstore.Store
	Backend projection.Backend
}

// NewEnvFunc returns a new Env for one subtest.
type NewEnvFunc func(t *testing.T) Env

// Run runs the suite. Subtests run in parallel.
func Run(t *testing.T, newEnv NewEnvFunc) {
	tests := []struct {
		name string
		run  func(t *testing.T, env Env)
	}{
		{"CatchUpHandlesEverythingOnce", testCatchUp},
		{"FailureStopsRightBeforeTheFailingEvent", testFailure},
		{"TypeFilter", testTypeFilter},
		{"ResetRebuilds", testReset},
		{"PauseAndResume", testPause},
		{"PauseAndResumeRecordWho", testPauseBy},
		{"PayloadThatDoesNotDecode", testDecode},
		{"ConcurrentRunners", testConcurrentRunners},
		{"CancelledMidBatch", testCancelled},
		{"LagAndStatus", testLag},
		{"HooksAndDelete", testHooks},
		{"FailingHookChangesNothing", testFailingHooks},
		{"UnknownAndUnregistered", testUnknown},
		{"SkipOneEvent", testSkip},
	}
	tests = append(tests, parkTests...)
	tests = append(tests, versionTests...)
	tests = append(tests, partitionTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newEnv(t))
		})
	}
}

// Payload is the payload of the suite's events.
type Payload struct {
	N int `json:"n"`
}

// AppendN appends n events numbered from..from+n-1, cycling through types, spread over streams,
// in appends of up to 100 events, and waits until all are readable. It returns the events'
// positions in read order.
func AppendN(t testing.TB, s eventstore.Store, from, n int, types ...string) []eventstore.Position {
	t.Helper()
	if len(types) == 0 {
		types = []string{"A"}
	}
	var positions []eventstore.Position
	for start := from; start < from+n; start += 100 {
		var batch []eventstore.EventData
		for i := start; i < min(start+100, from+n); i++ {
			data, err := eventstore.NewEventData(types[i%len(types)], Payload{N: i})
			require.NoError(t, err)
			batch = append(batch, data)
		}
		res, err := s.Append(context.Background(), fmt.Sprintf("stream-%d", start/100%7), eventstore.Any, batch...)
		require.NoError(t, err)
		for _, e := range res.Events {
			positions = append(positions, e.Position)
		}
	}
	if len(positions) > 0 {
		storetest.Settle(t, s, positions[len(positions)-1])
	}
	return positions
}

// Recorder records what idempotent handlers saw.
type Recorder struct {
	mu    sync.Mutex
	calls int
	seen  map[int]int // payload N → times handled
	order []int
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{seen: map[int]int{}} }

// Handle records e.
func (r *Recorder) Handle(_ context.Context, e projection.Event[Payload]) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.seen[e.Data.N]++
	r.order = append(r.order, e.Data.N)
	return nil
}

// Calls returns how many times Handle ran.
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Distinct returns how many different events were handled.
func (r *Recorder) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Times returns how often the event numbered n was handled.
func (r *Recorder) Times(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[n]
}

func newRunner(t testing.TB, env Env, projections ...*projection.Projection) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, projections...)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))
	return r
}

func mustProjection(t testing.TB, name string, cfg projection.Config, handlers ...projection.Handler) *projection.Projection {
	t.Helper()
	p, err := projection.New(name, cfg, handlers...)
	require.NoError(t, err)
	return p
}

func testCatchUp(t *testing.T, env Env) {
	ctx := context.Background()
	positions := AppendN(t, env.Store, 0, 1234, "A", "B")
	rec := NewRecorder()
	p := mustProjection(t, "everything", projection.Config{BatchSize: 100},
		projection.OnIdempotent("A", rec.Handle), projection.OnIdempotent("B", rec.Handle))
	r := newRunner(t, env, p)

	// One catch-up reads to the head in batches of 100, unless a transaction elsewhere in the
	// cluster holds the horizon back for a moment (a batch then reads short and the catch-up
	// ends): the next one goes on from there.
	var res projection.Result
	events, batches := 0, 0
	deadline := time.Now().Add(testwait.For(30 * time.Second))
	for res.Position != positions[len(positions)-1] && time.Now().Before(deadline) {
		if batches > 0 {
			time.Sleep(5 * time.Millisecond)
		}
		var err error
		res, err = r.CatchUp(ctx, "everything")
		require.NoError(t, err)
		events, batches = events+res.Events, batches+res.Batches
	}
	require.Equal(t, 1234, events)
	require.GreaterOrEqual(t, batches, 13, "batches of at most 100")
	require.Equal(t, positions[len(positions)-1], res.Position)
	require.Equal(t, res.Position, r.CommittedPosition("everything"))
	require.Equal(t, 1234, rec.Calls())
	require.Equal(t, 1234, rec.Distinct())
	for i, n := range rec.order {
		require.Equal(t, i, n, "events are handled in store order")
	}

	again, err := r.CatchUp(ctx, "everything")
	require.NoError(t, err)
	require.Zero(t, again.Events)
	require.Equal(t, res.Position, again.Position)

	st, err := r.Status(ctx, "everything")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, res.Position, st.Position)
	require.Equal(t, int64(1234), st.EventsProcessed)
	require.Zero(t, st.LagEvents)
	require.True(t, st.CaughtUp())
	require.Equal(t, res.Position, st.Head)
}

func testFailure(t *testing.T, env Env) {
	ctx := context.Background()
	positions := AppendN(t, env.Store, 1, 1000, "A")
	rec := NewRecorder()
	var broken atomic.Bool
	broken.Store(true)
	bug := errors.New("value too long for type character varying(25)")
	p := mustProjection(t, "fragile", projection.Config{BatchSize: 500}, projection.OnIdempotent("A",
		func(ctx context.Context, e projection.Event[Payload]) error {
			if e.Data.N == 750 && broken.Load() {
				return bug
			}
			return rec.Handle(ctx, e)
		}))
	r := newRunner(t, env, p)

	res, err := r.CatchUp(ctx, "fragile")
	require.ErrorIs(t, err, bug)
	require.ErrorIs(t, err, projection.ErrHandler)
	var he *projection.HandlerError
	require.ErrorAs(t, err, &he)
	require.Equal(t, "fragile", he.Projection)
	require.Equal(t, "A", he.Event.Type)
	require.Equal(t, positions[749], he.Event.Position)
	require.Contains(t, err.Error(), "value too long")
	require.Equal(t, 749, res.Events, "the events before the failing one are committed")
	require.Equal(t, positions[748], res.Position)

	st, err := r.Status(ctx, "fragile")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, positions[748], st.Position, "the position stops right before the failing event")
	require.Equal(t, int64(749), st.EventsProcessed)
	require.NotNil(t, st.FailingEvent)
	require.Equal(t, he.Event, *st.FailingEvent, "the status names the event the error names")
	require.Equal(t, positions[749], st.FailingEvent.Position)
	require.Equal(t, "A", st.FailingEvent.Type)
	require.Contains(t, st.LastError, "value too long")
	require.Equal(t, 1, st.Attempts)
	require.False(t, st.FirstFailureAt.IsZero())
	require.Equal(t, int64(251), st.LagEvents)
	for n := 1; n <= 749; n++ {
		require.Positive(t, rec.Times(n), "event %d handled", n)
	}
	require.Zero(t, rec.Times(750))
	require.Zero(t, rec.Times(751), "nothing after the failing event")

	// Failing again on the same event counts attempts; the first failure time stays.
	_, err = r.CatchUp(ctx, "fragile")
	require.ErrorIs(t, err, bug)
	again, err := r.Status(ctx, "fragile")
	require.NoError(t, err)
	require.Equal(t, 2, again.Attempts)
	require.Equal(t, st.FirstFailureAt, again.FirstFailureAt)
	require.Equal(t, st.Position, again.Position)

	// The fix: the next catch-up completes everything and clears the failure.
	broken.Store(false)
	res, err = r.CatchUp(ctx, "fragile")
	require.NoError(t, err)
	require.Equal(t, 251, res.Events)
	healed, err := r.Status(ctx, "fragile")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, healed.State)
	require.Nil(t, healed.FailingEvent)
	require.Empty(t, healed.LastError)
	require.Zero(t, healed.Attempts)
	require.Equal(t, int64(1000), healed.EventsProcessed)
	require.Equal(t, positions[999], healed.Position)
	require.Equal(t, 1000, rec.Distinct())
	for n := 750; n <= 1000; n++ {
		require.Equal(t, 1, rec.Times(n), "event %d handled once after the fix", n)
	}
}

func testTypeFilter(t *testing.T, env Env) {
	ctx := context.Background()
	types := []string{"T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9"}
	AppendN(t, env.Store, 0, 500, types...)
	var seen sync.Map
	handler := func(_ context.Context, e projection.Event[Payload]) error {
		seen.Store(e.Data.N, e.Type)
		return nil
	}
	p := mustProjection(t, "two-of-ten", projection.Config{BatchSize: 30},
		projection.OnIdempotent("T3", handler), projection.OnIdempotent("T7", handler))
	require.Equal(t, []string{"T3", "T7"}, p.Types())
	r := newRunner(t, env, p)
	// The lag counts readable events: a transaction of another database in its commit window
	// can hold the horizon below the appends for a moment (HeldByHorizon), so it is awaited.
	var st projection.Status
	require.Eventually(t, func() bool {
		var err error
		st, err = r.Status(ctx, "two-of-ten")
		require.NoError(t, err)
		return st.LagEvents == 100 || !st.HeldByHorizon
	}, testwait.For(time.Minute), time.Millisecond)
	require.Equal(t, int64(100), st.LagEvents, "lag counts only the projection's types")

	res, err := r.CatchUp(ctx, "two-of-ten")
	require.NoError(t, err)
	require.Equal(t, 100, res.Events)
	require.Equal(t, 4, res.Batches, "100 matching events in batches of 30: the filter runs in the read")
	count := 0
	seen.Range(func(_, v any) bool {
		count++
		require.Contains(t, []string{"T3", "T7"}, v)
		return true
	})
	require.Equal(t, 100, count)
}

func testReset(t *testing.T, env Env) {
	ctx := context.Background()
	AppendN(t, env.Store, 0, 300, "A")
	var (
		mu    sync.Mutex
		model = map[int]bool{}
		reset atomic.Int32
	)
	p := mustProjection(t, "rebuildable", projection.Config{
		BatchSize: 64,
		ResetFunc: func(context.Context, projection.HookParams) error {
			mu.Lock()
			defer mu.Unlock()
			reset.Add(1)
			clear(model)
			return nil
		},
	}, projection.OnIdempotent("A", func(_ context.Context, e projection.Event[Payload]) error {
		mu.Lock()
		defer mu.Unlock()
		model[e.Data.N] = true
		return nil
	}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "rebuildable")
	require.NoError(t, err)
	first := len(model)

	require.NoError(t, r.Reset(ctx, "rebuildable"))
	require.Equal(t, int32(1), reset.Load())
	require.Empty(t, model, "the reset hook ran")
	st, err := r.Status(ctx, "rebuildable")
	require.NoError(t, err)
	require.Equal(t, projection.StateRebuilding, st.State)
	require.True(t, st.Position.IsZero())
	require.False(t, st.RebuildStartedAt.IsZero())
	done, total := st.Progress()
	require.Equal(t, int64(0), done)
	require.Equal(t, int64(300), total)
	require.True(t, r.CommittedPosition("rebuildable").IsZero())

	res, err := r.CatchUp(ctx, "rebuildable")
	require.NoError(t, err)
	require.Equal(t, 300, res.Events)
	require.Equal(t, first, len(model))
	st, err = r.Status(ctx, "rebuildable")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State, "back to running at the head")
	require.Equal(t, int64(300), st.EventsProcessed)
}

func testPause(t *testing.T, env Env) {
	ctx := context.Background()
	AppendN(t, env.Store, 0, 10, "A")
	rec := NewRecorder()
	r := newRunner(t, env, mustProjection(t, "pausable", projection.Config{}, projection.OnIdempotent("A", rec.Handle)))
	require.NoError(t, r.Pause(ctx, "pausable"))
	res, err := r.CatchUp(ctx, "pausable")
	require.NoError(t, err)
	require.True(t, res.Paused)
	require.Zero(t, rec.Calls())
	st, err := r.Status(ctx, "pausable")
	require.NoError(t, err)
	require.Equal(t, projection.StatePaused, st.State)

	require.NoError(t, r.Resume(ctx, "pausable"))
	require.NoError(t, r.Resume(ctx, "pausable"), "resuming twice is harmless")
	res, err = r.CatchUp(ctx, "pausable")
	require.NoError(t, err)
	require.False(t, res.Paused)
	require.Equal(t, 10, res.Events)
}

// testPauseBy: a pause and a resume record who did them and when, shown by Status and
// Statuses (folded over a partitioned projection's partitions); pausing a paused projection
// or resuming a running one changes neither, nor does a batch; Pause without a name records
// the time alone.
func testPauseBy(t *testing.T, env Env) {
	ctx := context.Background()
	AppendN(t, env.Store, 0, 10, "A")
	rec := NewRecorder()
	r := newRunner(t, env, mustProjection(t, "audited", projection.Config{}, projection.OnIdempotent("A", rec.Handle)),
		mustProjection(t, "audited_parts", projection.Config{Partitions: 3}, projection.OnIdempotent("A", rec.Handle)))
	status := func(name string) projection.Status {
		t.Helper()
		st, err := r.Status(ctx, name)
		require.NoError(t, err)
		all, err := r.Statuses(ctx)
		require.NoError(t, err)
		for _, s := range all {
			if s.Name == name {
				require.Equal(t, st.StateChangedBy, s.StateChangedBy, "Statuses agrees with Status")
				require.True(t, st.StateChangedAt.Equal(s.StateChangedAt), "Statuses agrees with Status")
			}
		}
		return st
	}
	st := status("audited")
	require.Empty(t, st.StateChangedBy, "nobody paused it yet")
	require.True(t, st.StateChangedAt.IsZero())

	require.NoError(t, r.PauseBy(ctx, "audited", "ann"))
	st = status("audited")
	require.Equal(t, projection.StatePaused, st.State)
	require.Equal(t, "ann", st.StateChangedBy)
	require.WithinDuration(t, time.Now(), st.StateChangedAt, time.Minute)
	pausedAt := st.StateChangedAt

	require.NoError(t, r.PauseBy(ctx, "audited", "bob"), "pausing a paused projection is harmless")
	res, err := r.CatchUp(ctx, "audited")
	require.NoError(t, err)
	require.True(t, res.Paused)
	st = status("audited")
	require.Equal(t, "ann", st.StateChangedBy, "a second pause and a batch leave who paused it")
	require.True(t, pausedAt.Equal(st.StateChangedAt), "%s != %s", pausedAt, st.StateChangedAt)

	require.NoError(t, r.ResumeBy(ctx, "audited", "bob"))
	require.NoError(t, r.ResumeBy(ctx, "audited", "carl"), "resuming a running projection is harmless")
	res, err = r.CatchUp(ctx, "audited")
	require.NoError(t, err)
	require.Equal(t, 10, res.Events)
	st = status("audited")
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, "bob", st.StateChangedBy, "who resumed it; the second resume and the batch left it")
	require.False(t, st.StateChangedAt.Before(pausedAt))

	require.NoError(t, r.Pause(ctx, "audited"))
	st = status("audited")
	require.Equal(t, projection.StatePaused, st.State)
	require.Empty(t, st.StateChangedBy, "Pause names nobody")
	require.WithinDuration(t, time.Now(), st.StateChangedAt, time.Minute)
	require.NoError(t, r.ResumeBy(ctx, "audited", "bob"))
	require.NoError(t, r.Reset(ctx, "audited"))
	st = status("audited")
	require.Equal(t, projection.StateRebuilding, st.State)
	require.Equal(t, "bob", st.StateChangedBy, "a reset leaves who resumed it last")

	require.NoError(t, r.PauseBy(ctx, "audited_parts", "dora"))
	st = status("audited_parts")
	require.Equal(t, projection.StatePaused, st.State)
	require.Equal(t, "dora", st.StateChangedBy, "folded from the partitions")
	require.WithinDuration(t, time.Now(), st.StateChangedAt, time.Minute)
	require.Len(t, st.Partitions, 3)
	for _, part := range st.Partitions {
		require.Equal(t, "dora", part.StateChangedBy, part.Name)
		require.True(t, st.StateChangedAt.Equal(part.StateChangedAt), part.Name)
	}
	require.NoError(t, r.ResumeBy(ctx, "audited_parts", "ed"))
	st = status("audited_parts")
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, "ed", st.StateChangedBy)
}

func testDecode(t *testing.T, env Env) {
	ctx := context.Background()
	_, err := env.Store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{"n": "not a number"}`)})
	require.NoError(t, err)
	positions := AppendN(t, env.Store, 1, 1, "A")
	rec := NewRecorder()
	r := newRunner(t, env, mustProjection(t, "typed", projection.Config{}, projection.OnIdempotent("A", rec.Handle)))
	_, err = r.CatchUp(ctx, "typed")
	require.ErrorIs(t, err, projection.ErrDecode)
	var de *projection.DecodeError
	require.ErrorAs(t, err, &de)
	require.Equal(t, "A", de.EventType)
	require.Equal(t, "projectiontest.Payload", de.Target)
	require.Contains(t, err.Error(), "does not decode into projectiontest.Payload")
	st, err := r.Status(ctx, "typed")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.True(t, st.Position.IsZero())
	require.True(t, st.FailingEvent.Position.Less(positions[0]))
}

func testConcurrentRunners(t *testing.T, env Env) {
	ctx := context.Background()
	rec := NewRecorder()
	p := mustProjection(t, "contended", projection.Config{BatchSize: 50}, projection.OnIdempotent("A", rec.Handle))
	const runners = 4
	rs := make([]*projection.Runner, runners)
	for i := range rs {
		rs[i] = newRunner(t, env, p)
	}
	var (
		wg   sync.WaitGroup
		done atomic.Bool
	)
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if _, err := r.CatchUp(ctx, "contended"); err != nil {
					t.Errorf("catch-up: %v", err)
					return
				}
			}
		}()
	}
	AppendN(t, env.Store, 0, 2000, "A")
	require.Eventually(t, func() bool { return rec.Distinct() == 2000 }, testwait.For(2*time.Minute), 5*time.Millisecond)
	done.Store(true)
	wg.Wait()
	require.Equal(t, 2000, rec.Calls(), "each event handled once: the runners did not duplicate work")
	for i := range 2000 {
		require.Equal(t, 1, rec.Times(i))
	}
}

func testCancelled(t *testing.T, env Env) {
	AppendN(t, env.Store, 0, 100, "A")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := mustProjection(t, "interrupted", projection.Config{}, projection.OnIdempotent("A",
		func(ctx context.Context, e projection.Event[Payload]) error {
			if e.Data.N == 40 {
				cancel()
				return ctx.Err()
			}
			return nil
		}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "interrupted")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, projection.ErrHandler, "shutting down is not a handler failure")

	st, err := r.Status(context.Background(), "interrupted")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State, "no failure recorded")
	require.True(t, st.Position.IsZero(), "the batch rolled back")
	require.Nil(t, st.FailingEvent)
	require.Zero(t, st.EventsProcessed)
}

func testLag(t *testing.T, env Env) {
	ctx := context.Background()
	rec := NewRecorder()
	r := newRunner(t, env, mustProjection(t, "lagging", projection.Config{}, projection.OnIdempotent("A", rec.Handle)))
	st, err := r.Status(ctx, "lagging")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)
	require.Zero(t, st.LagTime)
	require.False(t, st.HeldByHorizon)

	positions := AppendN(t, env.Store, 0, 42, "A", "Other")
	require.Eventually(t, func() bool {
		st, err = r.Status(ctx, "lagging")
		require.NoError(t, err)
		return st.LagTime > 0
	}, testwait.For(time.Minute), time.Millisecond)
	require.Equal(t, int64(21), st.LagEvents)
	require.Equal(t, positions[41], st.Head)
	require.Equal(t, projection.StateRunning, st.State)

	_, err = r.CatchUp(ctx, "lagging")
	require.NoError(t, err)
	st, err = r.Status(ctx, "lagging")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)
	require.Zero(t, st.LagTime)
	require.False(t, st.UpdatedAt.IsZero())
}

func testHooks(t *testing.T, env Env) {
	ctx := context.Background()
	var inits, deletes atomic.Int32
	p := mustProjection(t, "hooked", projection.Config{
		InitFunc:   func(context.Context, projection.HookParams) error { inits.Add(1); return nil },
		DeleteFunc: func(context.Context, projection.HookParams) error { deletes.Add(1); return nil },
	}, projection.OnIdempotent("A", NewRecorder().Handle))
	r := newRunner(t, env, p)
	require.NoError(t, r.Init(ctx), "init runs again without harm")
	require.Equal(t, int32(2), inits.Load())
	require.NoError(t, r.Delete(ctx, "hooked"))
	require.Equal(t, int32(1), deletes.Load())
	_, err := r.Status(ctx, "hooked")
	require.ErrorIs(t, err, projection.ErrNotRegistered)
	_, err = r.CatchUp(ctx, "hooked")
	require.ErrorIs(t, err, projection.ErrNotRegistered)
	require.NoError(t, r.Init(ctx))
	_, err = r.Status(ctx, "hooked")
	require.NoError(t, err)

	failing := mustProjection(t, "bad-init", projection.Config{
		InitFunc: func(context.Context, projection.HookParams) error { return errors.New("no permission to create table") },
	}, projection.OnIdempotent("A", NewRecorder().Handle))
	fr, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, failing)
	require.NoError(t, err)
	require.ErrorContains(t, fr.Init(ctx), "no permission to create table")
}

// testFailingHooks: the runner runs the hooks in the backend's unit of the state change, with
// the projection's name; a failing reset or delete hook leaves the status as it was and says
// which hook failed.
func testFailingHooks(t *testing.T, env Env) {
	ctx := context.Background()
	AppendN(t, env.Store, 0, 10, "A")
	var named []string
	var mu sync.Mutex
	fail := func(ctx context.Context, p projection.HookParams) error {
		mu.Lock()
		defer mu.Unlock()
		named = append(named, p.Projection)
		return errors.New("read model is locked")
	}
	p := mustProjection(t, "unhookable", projection.Config{ResetFunc: fail, DeleteFunc: fail},
		projection.OnIdempotent("A", NewRecorder().Handle))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "unhookable")
	require.NoError(t, err)
	before, err := r.Status(ctx, "unhookable")
	require.NoError(t, err)

	err = r.Reset(ctx, "unhookable")
	require.ErrorContains(t, err, "projection unhookable: reset: reset hook: read model is locked")
	err = r.Delete(ctx, "unhookable")
	require.ErrorContains(t, err, "projection unhookable: delete: delete hook: read model is locked")
	require.Equal(t, []string{"unhookable", "unhookable"}, named)

	after, err := r.Status(ctx, "unhookable")
	require.NoError(t, err, "the status row is still there")
	require.Equal(t, before.Position, after.Position)
	require.Equal(t, projection.StateRunning, after.State)
	require.Equal(t, int64(10), after.EventsProcessed)
	require.Equal(t, before.Position, r.CommittedPosition("unhookable"))
}

func testUnknown(t *testing.T, env Env) {
	ctx := context.Background()
	p := mustProjection(t, "known", projection.Config{}, projection.OnIdempotent("A", NewRecorder().Handle))
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, p)
	require.NoError(t, err)
	_, err = r.CatchUp(ctx, "known")
	require.ErrorIs(t, err, projection.ErrNotRegistered, "Init was not run")
	require.NoError(t, r.Init(ctx))
	_, err = r.CatchUp(ctx, "unknown")
	require.ErrorIs(t, err, projection.ErrUnknownProjection)
	require.ErrorContains(t, err, "[known]")
	_, err = r.Status(ctx, "unknown")
	require.ErrorIs(t, err, projection.ErrUnknownProjection)
	require.ErrorIs(t, r.Reset(ctx, "unknown"), projection.ErrUnknownProjection)
}

func testSkip(t *testing.T, env Env) {
	ctx := context.Background()
	positions := AppendN(t, env.Store, 1, 10, "A")
	rec := NewRecorder()
	var skipped []projection.SkipParams
	p := mustProjection(t, "skippy", projection.Config{
		SkipFunc: func(_ context.Context, sp projection.SkipParams) error {
			sp.Tx = nil
			skipped = append(skipped, sp)
			return nil
		},
	}, projection.OnIdempotent("A", func(ctx context.Context, e projection.Event[Payload]) error {
		if e.Data.N == 5 {
			return errors.New("cannot handle 5")
		}
		return rec.Handle(ctx, e)
	}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "skippy")
	require.ErrorIs(t, err, projection.ErrHandler)
	st, err := r.Status(ctx, "skippy")
	require.NoError(t, err)
	poison := st.FailingEvent.ID

	opts := projection.SkipOptions{Reason: "bad data, fixed by hand", By: "ann"}
	_, err = r.Skip(ctx, "skippy", poison, projection.SkipOptions{By: "ann"})
	require.ErrorIs(t, err, projection.ErrSkipRefused, "a skip needs a reason")
	other := uuid.New()
	_, err = r.Skip(ctx, "skippy", other, opts)
	require.ErrorIs(t, err, projection.ErrSkipRefused)
	require.ErrorContains(t, err, "is failing on event "+poison.String())
	_, err = r.Skip(ctx, "skippy", other, projection.SkipOptions{Reason: "x", By: "ann", Force: true})
	require.ErrorIs(t, err, projection.ErrSkipRefused, "even forced, only the next event")
	require.ErrorContains(t, err, "not the next event")
	require.Empty(t, skipped)

	e, err := r.Skip(ctx, "skippy", poison, opts)
	require.NoError(t, err)
	require.Equal(t, poison, e.ID)
	require.Equal(t, positions[4], e.Position)
	require.Len(t, skipped, 1)
	require.Equal(t, poison, skipped[0].Event.ID)
	require.Equal(t, "ann", skipped[0].By)
	st, err = r.Status(ctx, "skippy")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Nil(t, st.FailingEvent)
	require.Equal(t, positions[4], st.Position, "past exactly one event")
	require.NotNil(t, st.LastSkip)
	require.Equal(t, poison, st.LastSkip.Event.ID)
	require.Equal(t, "ann", st.LastSkip.By)
	require.Equal(t, "bad data, fixed by hand", st.LastSkip.Reason)
	require.False(t, st.LastSkip.Forced)

	res, err := r.CatchUp(ctx, "skippy")
	require.NoError(t, err)
	require.Equal(t, 5, res.Events)
	require.Zero(t, rec.Times(5), "the skipped event was never handled")
	require.Equal(t, 9, rec.Distinct())

	// Forced: skip the next event of a projection that is not failing.
	next := AppendN(t, env.Store, 100, 2, "A")
	stored, err := env.Store.Read(ctx, positions[9], eventstore.ReadOptions{Limit: 1})
	require.NoError(t, err)
	_, err = r.Skip(ctx, "skippy", stored[0].ID, opts)
	require.ErrorIs(t, err, projection.ErrSkipRefused, "not failing: Force is needed")
	_, err = r.Skip(ctx, "skippy", stored[0].ID, projection.SkipOptions{Reason: "duplicate import", By: "ops", Force: true})
	require.NoError(t, err)
	st, err = r.Status(ctx, "skippy")
	require.NoError(t, err)
	require.Equal(t, next[0], st.Position)
	require.True(t, st.LastSkip.Forced)
	res, err = r.CatchUp(ctx, "skippy")
	require.NoError(t, err)
	require.Equal(t, 1, res.Events)
	require.Zero(t, rec.Times(100))
}
