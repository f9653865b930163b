package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// fakeWaker is a projection.Waker the test drives.
type fakeWaker struct {
	ch        chan struct{}
	listening atomic.Bool
}

func newFakeWaker() *fakeWaker { return &fakeWaker{ch: make(chan struct{}, 1)} }

func (w *fakeWaker) Subscribe() (<-chan struct{}, func()) { return w.ch, func() {} }
func (w *fakeWaker) Listening() bool                      { return w.listening.Load() }
func (w *fakeWaker) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// pollerPolls runs a poller of a one-projection runner with waker until t ends, returning its
// polls.
func pollerPolls(t *testing.T, cfg projection.PollerConfig, waker projection.Waker) (env, *projectiontest.Recorder, <-chan projection.PollParams) {
	t.Helper()
	e := newEnv(t)
	rec := projectiontest.NewRecorder()
	r := runner(t, e.backend, mustNew(t, "woken", projection.OnIdempotent("A", rec.Handle)))
	polls := make(chan projection.PollParams, 1000)
	cfg.Waker = waker
	cfg.AfterPollFunc = func(p projection.PollParams) {
		select {
		case polls <- p:
		default:
		}
	}
	poller, err := projection.NewPoller(r, cfg)
	require.NoError(t, err)
	runPoller(t, poller)
	return e, rec, polls
}

func nextPoll(t *testing.T, polls <-chan projection.PollParams) projection.PollParams {
	t.Helper()
	select {
	case p := <-polls:
		return p
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("no poll")
		return projection.PollParams{}
	}
}

// TestPollerWokenByWaker: with its polls an hour apart, an idle poller catches up on a wake-up.
func TestPollerWokenByWaker(t *testing.T) {
	t.Parallel()
	waker := newFakeWaker()
	waker.listening.Store(true)
	e, rec, polls := pollerPolls(t, projection.PollerConfig{MinInterval: time.Hour, MaxInterval: time.Hour, MaxFailureInterval: time.Hour}, waker)
	first := nextPoll(t, polls)
	require.Zero(t, first.Result.Events)
	require.Equal(t, time.Hour, first.Next)

	projectiontest.AppendN(t, e.store, 0, 10, "A")
	waker.wake()
	// Every poll from here on was woken: the next is an hour away. A wake-up that came before
	// the events were readable (a transaction elsewhere in the cluster held the store's
	// horizon) finds nothing: then wait until they are and wake the poller again.
	for nextPoll(t, polls).Result.Events == 0 {
		require.Eventually(t, func() bool {
			head, err := e.store.Head(context.Background())
			return err == nil && head.GlobalPosition >= 10
		}, testwait.For(time.Minute), time.Millisecond)
		waker.wake()
	}
	require.Equal(t, 10, rec.Distinct())
}

// TestPollerFallsBackWhileNotListening: the idle wait is capped by MaxInterval while the
// Waker does not listen, and grows past it, up to ListeningMaxInterval, once it listens.
func TestPollerFallsBackWhileNotListening(t *testing.T) {
	t.Parallel()
	waker := newFakeWaker()
	_, _, polls := pollerPolls(t, projection.PollerConfig{MinInterval: time.Millisecond, MaxInterval: 4 * time.Millisecond,
		ListeningMaxInterval: time.Hour}, waker)
	for range 8 {
		p := nextPoll(t, polls)
		require.LessOrEqual(t, p.Next, 4*time.Millisecond, "not listening: MaxInterval caps the wait")
	}
	waker.listening.Store(true)
	waker.wake()
	var longest time.Duration
	for longest <= 4*time.Millisecond {
		p := nextPoll(t, polls)
		longest = max(longest, p.Next)
	}
	require.Greater(t, longest, 4*time.Millisecond, "listening: the idle wait grows past MaxInterval")
}
