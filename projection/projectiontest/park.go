package projectiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// parkTests are the suite's tests of parked streams (Config.OnFailure = OnFailurePark).
var parkTests = []struct {
	name string
	run  func(t *testing.T, env Env)
}{
	{"ParkStreamOthersGoOn", testParkStream},
	{"ParkPermanentAtOnce", testParkPermanent},
	{"ParkLimitStops", testParkLimit},
	{"RedriveFailsStaysParked", testRedriveFails},
	{"ResetClearsParking", testResetClearsParking},
	{"SkipAndPurgeParked", testSkipAndPurgeParked},
	{"ParkFromFlush", testParkFromFlush},
	{"ParkCrashLoopVerdict", testParkCrashLoop},
}

// StreamPayload is the payload of the park tests' events.
type StreamPayload struct {
	Stream string `json:"stream"`
	V      int    `json:"v"`
}

// streamLog records, per stream, the versions handled, in the order they were first handled:
// OnIdempotent handlers may see an event again (a failed batch's events before the failing
// one run again in its good prefix), so repeats are not recorded.
type streamLog struct {
	mu   sync.Mutex
	seen map[string][]int
}

func newStreamLog() *streamLog { return &streamLog{seen: map[string][]int{}} }

func (l *streamLog) add(e projection.Event[StreamPayload]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.seen[e.Data.Stream], e.Data.V) {
		l.seen[e.Data.Stream] = append(l.seen[e.Data.Stream], e.Data.V)
	}
}

func (l *streamLog) of(stream string) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.seen[stream]...)
}

// appendRounds appends rounds events to each of streams, one event per stream in turn, so the
// streams interleave in the store's order, and waits until all are readable. Versions go on
// from what the streams have.
func appendRounds(t testing.TB, s eventstore.Store, rounds int, streams ...string) {
	t.Helper()
	ctx := context.Background()
	var last eventstore.Position
	for range rounds {
		for _, id := range streams {
			have, err := s.ReadStream(ctx, id, 0, eventstore.ReadLimitMax)
			require.NoError(t, err)
			data, err := eventstore.NewEventData("S", StreamPayload{Stream: id, V: len(have) + 1})
			require.NoError(t, err)
			res, err := s.Append(ctx, id, eventstore.Any, data)
			require.NoError(t, err)
			last = res.Last()
		}
	}
	storetest.Settle(t, s, last)
}

// seq returns from..to.
func seq(from, to int) []int {
	var out []int
	for v := from; v <= to; v++ {
		out = append(out, v)
	}
	return out
}

// parkable is a projection of "S" events whose handler fails on stream bad's version at
// (while broken), with err.
func parkable(t testing.TB, name string, cfg projection.Config, log *streamLog, broken *atomic.Bool, bad string, at int, err error) *projection.Projection {
	t.Helper()
	cfg.OnFailure = projection.OnFailurePark
	return mustProjection(t, name, cfg, projection.OnIdempotent("S", func(_ context.Context, e projection.Event[StreamPayload]) error {
		if e.Data.Stream == bad && e.Data.V == at && broken.Load() {
			return err
		}
		log.add(e)
		return nil
	}))
}

func testParkStream(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 10, "a", "b", "c")
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	bug := errors.New("value too long for type character varying(25)")
	p := parkable(t, "parking", projection.Config{BatchSize: 7, ParkAfterAttempts: 2}, log, &broken, "b", 4, bug)
	r := newRunner(t, env, p)

	// First failure: recorded, not parked yet (1 attempt of 2).
	_, err := r.CatchUp(ctx, "parking")
	require.ErrorIs(t, err, bug)
	st, err := r.Status(ctx, "parking")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Zero(t, st.ParkedStreams)

	// Second failure: the stream parks and the catch-up goes on to the end.
	res, err := r.CatchUp(ctx, "parking")
	require.NoError(t, err)
	require.Positive(t, res.Events)
	st, err = r.Status(ctx, "parking")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Nil(t, st.FailingEvent)
	require.Zero(t, st.LagEvents, "the projection passed every event")
	require.Equal(t, 1, st.ParkedStreams)
	require.False(t, st.OldestParkedAt.IsZero())
	require.Equal(t, seq(1, 10), log.of("a"), "other streams flow")
	require.Equal(t, seq(1, 10), log.of("c"), "other streams flow")
	require.Equal(t, seq(1, 3), log.of("b"), "nothing of b after the failing event")
	require.Equal(t, int64(23), st.EventsProcessed, "held events are not processed")

	parked, err := r.Parked(ctx, "parking")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	ps := parked[0]
	require.Equal(t, "b", ps.StreamID)
	require.Equal(t, int64(4), ps.StreamVersion)
	require.Equal(t, "b", ps.Event.StreamID)
	require.Contains(t, ps.Error, "value too long")
	require.Equal(t, 2, ps.Attempts)
	require.Equal(t, int64(6), ps.Held, "versions 5 to 10 are held")
	b10, err := env.Store.ReadStream(ctx, "b", 9, 1)
	require.NoError(t, err)
	require.Equal(t, b10[0].Position, ps.LastHeld, "the last held event is b's version 10")

	// More events: b's are held, the others handled.
	appendRounds(t, env.Store, 2, "a", "b", "c")
	_, err = r.CatchUp(ctx, "parking")
	require.NoError(t, err)
	require.Equal(t, seq(1, 12), log.of("a"))
	require.Equal(t, seq(1, 3), log.of("b"))
	parked, err = r.Parked(ctx, "parking")
	require.NoError(t, err)
	require.Equal(t, int64(8), parked[0].Held)

	// The fix, then the redrive: every parked event of b, in order, once.
	broken.Store(false)
	n, err := r.Redrive(ctx, "parking", "b", "test")
	require.NoError(t, err)
	require.Equal(t, 9, n)
	require.Equal(t, seq(1, 12), log.of("b"))
	_, err = r.Redrive(ctx, "parking", "b", "test")
	require.ErrorIs(t, err, projection.ErrNotParked)
	st, err = r.Status(ctx, "parking")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams)
	require.True(t, st.OldestParkedAt.IsZero())
	require.Equal(t, int64(36), st.EventsProcessed)

	// Unparked: b's new events are handled live.
	appendRounds(t, env.Store, 1, "b")
	_, err = r.CatchUp(ctx, "parking")
	require.NoError(t, err)
	require.Equal(t, seq(1, 13), log.of("b"))
}

func testParkPermanent(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 3, "a", "b")
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	p := parkable(t, "permanent", projection.Config{}, log, &broken, "a", 2, retry.Permanent(errors.New("cannot ever")))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "permanent")
	require.NoError(t, err, "a permanent error parks at the first failure")
	require.Equal(t, seq(1, 3), log.of("b"))
	require.Equal(t, []int{1}, log.of("a"))
	parked, err := r.Parked(ctx, "permanent")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, 1, parked[0].Attempts)
	require.Equal(t, int64(1), parked[0].Held)
}

func testParkLimit(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 3, "a", "b", "c")
	log := newStreamLog()
	p := mustProjection(t, "bounded", projection.Config{OnFailure: projection.OnFailurePark, MaxParkedStreams: 1, ParkAfterAttempts: 1},
		projection.OnIdempotent("S", func(_ context.Context, e projection.Event[StreamPayload]) error {
			if e.Data.Stream != "c" && e.Data.V == 2 {
				return fmt.Errorf("bad %s", e.Data.Stream)
			}
			log.add(e)
			return nil
		}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "bounded")
	require.ErrorIs(t, err, projection.ErrHandler, "past the limit the projection stops")
	require.ErrorContains(t, err, "bad b")
	st, err := r.Status(ctx, "bounded")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, 1, st.ParkedStreams)
	require.Equal(t, "b", st.FailingEvent.StreamID)
	require.Equal(t, []int{1}, log.of("c"), "nothing after b's failing event: never skipped")
	_, err = r.CatchUp(ctx, "bounded")
	require.ErrorIs(t, err, projection.ErrHandler, "and it stays stopped")
}

func testRedriveFails(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 3, "a", "b")
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	p := parkable(t, "stubborn", projection.Config{ParkAfterAttempts: 1}, log, &broken, "a", 1, errors.New("first error"))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "stubborn")
	require.NoError(t, err)
	n, err := r.Redrive(ctx, "stubborn", "a", "test")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.Zero(t, n)
	require.Empty(t, log.of("a"), "a failed redrive applies nothing")
	parked, err := r.Parked(ctx, "stubborn")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, 2, parked[0].Attempts)
	require.Equal(t, int64(2), parked[0].Held)

	broken.Store(false)
	done, err := r.RedriveAll(ctx, "stubborn", "test")
	require.NoError(t, err)
	require.Equal(t, 1, done)
	require.Equal(t, seq(1, 3), log.of("a"))
}

func testResetClearsParking(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 2, "a", "b")
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	p := parkable(t, "rebuilt", projection.Config{ParkAfterAttempts: 1}, log, &broken, "a", 1, errors.New("bug"))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "rebuilt")
	require.NoError(t, err)
	broken.Store(false)
	require.NoError(t, r.Reset(ctx, "rebuilt"))
	st, err := r.Status(ctx, "rebuilt")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams, "a reset clears the projection's parking")
	_, err = r.CatchUp(ctx, "rebuilt")
	require.NoError(t, err)
	require.Equal(t, seq(1, 2), log.of("a"))
}

func testSkipAndPurgeParked(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 2, "a", "b", "c")
	log := newStreamLog()
	p := mustProjection(t, "dropped", projection.Config{OnFailure: projection.OnFailurePark, ParkAfterAttempts: 1},
		projection.OnIdempotent("S", func(_ context.Context, e projection.Event[StreamPayload]) error {
			if e.Data.Stream != "c" && e.Data.V == 1 {
				return errors.New("bug")
			}
			log.add(e)
			return nil
		}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "dropped")
	require.NoError(t, err)
	st, err := r.Status(ctx, "dropped")
	require.NoError(t, err)
	require.Equal(t, 2, st.ParkedStreams)

	require.ErrorIs(t, r.SkipParked(ctx, "dropped", "a", projection.ParkOptions{By: "ann"}), projection.ErrInvalidConfig, "a reason is required")
	require.ErrorIs(t, r.SkipParked(ctx, "dropped", "c", projection.ParkOptions{By: "ann", Reason: "x"}), projection.ErrNotParked)
	require.NoError(t, r.SkipParked(ctx, "dropped", "a", projection.ParkOptions{By: "ann", Reason: "bad import"}))
	appendRounds(t, env.Store, 1, "a")
	_, err = r.CatchUp(ctx, "dropped")
	require.NoError(t, err)
	require.Equal(t, []int{3}, log.of("a"), "skipped: the parked events are never handled, later ones are")

	require.NoError(t, r.PurgeParked(ctx, "dropped", projection.ParkOptions{By: "ann", Reason: "drop all"}))
	st, err = r.Status(ctx, "dropped")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams)
	require.Empty(t, log.of("b"))
}

func testParkFromFlush(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 2, "a", "b")
	log := newStreamLog()
	var named atomic.Bool
	named.Store(true)
	p := mustProjection(t, "flushed", projection.Config{OnFailure: projection.OnFailurePark, ParkAfterAttempts: 1,
		FlushFunc: func(_ context.Context, fp projection.FlushParams) error {
			for _, e := range fp.Events {
				if e.StreamID == "b" && e.StreamVersion == 1 {
					if named.Load() {
						return projection.FlushFailedOn(e, errors.New("b rejected by the flush"))
					}
					return errors.New("the flush failed on something")
				}
			}
			return nil
		}},
		projection.OnIdempotent("S", func(_ context.Context, e projection.Event[StreamPayload]) error {
			log.add(e)
			return nil
		}))
	r := newRunner(t, env, p)

	// A flush error that names no event stops the projection, even in park mode.
	named.Store(false)
	_, err := r.CatchUp(ctx, "flushed")
	require.ErrorIs(t, err, projection.ErrHandler)
	st, err := r.Status(ctx, "flushed")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Zero(t, st.ParkedStreams)

	// Naming the event parks its stream.
	named.Store(true)
	_, err = r.CatchUp(ctx, "flushed")
	require.NoError(t, err)
	parked, err := r.Parked(ctx, "flushed")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "b", parked[0].StreamID)
	require.Contains(t, parked[0].Error, "b rejected by the flush")
}

func testParkCrashLoop(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 3, "a", "b")
	log := newStreamLog()
	var broken atomic.Bool // never set: the "crash" is simulated through the attempts below
	p := parkable(t, "crashy", projection.Config{CrashLoopLimit: 2}, log, &broken, "a", 1, nil)
	r := newRunner(t, env, p)
	// What processes dying in the first event's handler leave behind: batches started at the
	// start position without finishing, the last ones one event at a time (careful).
	events, err := env.Store.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 10})
	require.NoError(t, err)
	_, err = env.Backend.StartAttempt(ctx, p, eventstore.Position{}, events[len(events)-1].Position)
	require.NoError(t, err)
	for range 2 {
		_, err = env.Backend.StartAttempt(ctx, p, eventstore.Position{}, eventstore.Position{})
		require.NoError(t, err)
	}
	_, err = r.CatchUp(ctx, "crashy")
	require.NoError(t, err, "the crash-loop verdict parks the stream at once; the rest goes on")
	require.Empty(t, log.of("a"), "the event that kills the process is not handed to the handler")
	require.Equal(t, seq(1, 3), log.of("b"))
	parked, err := r.Parked(ctx, "crashy")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "a", parked[0].StreamID)
	require.Contains(t, parked[0].Error, "the process stopped")

	n, err := r.Redrive(ctx, "crashy", "a", "test")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, seq(1, 3), log.of("a"))
}
