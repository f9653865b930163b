package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/retry"
)

var (
	errTransient = errors.New("database is down")
	errPoison    = errors.New("handler cannot project event 7")
	errStore     = errors.New("dead-letter table is gone")
)

// t0 is when the fake clock starts.
var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// fakeClock is a clock whose sleeps return at once and move it forward. The unit tests call
// the handler on their own goroutine, so it needs no lock.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.sleeps = append(c.sleeps, d)
	c.Advance(d)
	return nil
}

// deadLetter is one call of DeadLetterFunc.
type deadLetter struct {
	uuid     string
	metadata message.Metadata
	err      error
}

// harness runs a handler through the middleware with a fake clock and a rand of 0.5.
type harness struct {
	clock       fakeClock
	cfg         retry.Config
	retries     []retry.RetryParams
	deadLetters []deadLetter
	// deadLetterErr is what DeadLetterFunc returns.
	deadLetterErr error
	calls         int
}

func newHarness() *harness {
	h := &harness{clock: fakeClock{now: t0}}
	h.cfg = retry.Config{
		DeadLetterFunc: func(msg *message.Message, err error) error {
			h.deadLetters = append(h.deadLetters, deadLetter{uuid: msg.UUID, metadata: maps.Clone(msg.Metadata), err: err})
			return h.deadLetterErr
		},
		OnRetryFunc: func(p retry.RetryParams) { h.retries = append(h.retries, p) },
		Logger:      slog.New(slog.DiscardHandler),
		NowFunc:     h.clock.Now,
		SleepFunc:   h.clock.Sleep,
		RandFunc:    func() float64 { return 0.5 },
	}
	return h
}

// handle runs fn (given the attempt number, from 1) through the middleware for one message.
func (h *harness) handle(t *testing.T, ctx context.Context, fn func(attempt int) error) ([]*message.Message, error) {
	t.Helper()
	return h.handler(t, fn)(ctx)
}

// handler returns a function that runs fn through the middleware for one message, for a
// goroutine of its own.
func (h *harness) handler(t *testing.T, fn func(attempt int) error) func(ctx context.Context) ([]*message.Message, error) {
	t.Helper()
	mw, err := retry.Middleware(h.cfg)
	require.NoError(t, err)
	require.Len(t, mw, 3)
	handler := compose(mw, func(*message.Message) ([]*message.Message, error) {
		h.calls++
		if err := fn(h.calls); err != nil {
			return []*message.Message{message.NewMessage("discarded", nil)}, err
		}
		return []*message.Message{message.NewMessage("produced", nil)}, nil
	})
	return func(ctx context.Context) ([]*message.Message, error) {
		msg := message.NewMessage("msg-1", []byte(`{"v":1}`))
		msg.SetContext(ctx)
		return handler(msg)
	}
}

// compose applies mw the way a Watermill router does: the first is the outermost.
func compose(mw []message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

func (h *harness) retriedAttempts() (attempts []int, delays []time.Duration) {
	for _, p := range h.retries {
		attempts = append(attempts, p.Attempt)
		delays = append(delays, p.Delay)
	}
	return attempts, delays
}

func giveUp(t *testing.T, err error) *retry.GiveUpError {
	t.Helper()
	var g *retry.GiveUpError
	require.ErrorAs(t, err, &g)
	return g
}

func TestRetriesUntilSuccess(t *testing.T) {
	t.Parallel()
	h := newHarness()
	msgs, err := h.handle(t, t.Context(), func(attempt int) error {
		if attempt < 3 {
			return errTransient
		}
		return nil
	})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "produced", msgs[0].UUID, "the successful attempt's messages are returned")
	require.Equal(t, 3, h.calls)
	require.Equal(t, []time.Duration{200 * ms, 400 * ms}, h.clock.sleeps)
	attempts, delays := h.retriedAttempts()
	require.Equal(t, []int{1, 2}, attempts)
	require.Equal(t, []time.Duration{200 * ms, 400 * ms}, delays)
	for _, p := range h.retries {
		require.ErrorIs(t, p.Err, errTransient)
		require.Equal(t, "msg-1", p.Message.UUID)
		require.Empty(t, p.Handler, "no router, no handler name")
	}
	require.Empty(t, h.deadLetters)
}

func TestDelaysFollowThePolicy(t *testing.T) {
	t.Parallel()
	h := newHarness()
	h.cfg.Policy = retry.Policy{MaxAttempts: 9, InitialInterval: 100 * ms, MaxInterval: time.Second, Multiplier: 3, Jitter: 0.5, MaxElapsedTime: -1}
	randoms := []float64{0, 0.5, almostOne, 0.25, 0.5, 0, almostOne, 0.5}
	h.cfg.RandFunc = func() float64 {
		r := randoms[0]
		randoms = randoms[1:]
		return r
	}
	_, err := h.handle(t, t.Context(), func(int) error { return errTransient })
	require.ErrorIs(t, err, errTransient)
	require.Equal(t, []time.Duration{
		50 * ms,   // 100 ms, bottom of ±50 %
		300 * ms,  // 300 ms, middle
		1350 * ms, // 900 ms, top
		750 * ms,  // 1 s (capped from 2.7 s), a quarter: ×0.75
		1000 * ms, // capped, middle
		500 * ms,  // capped, bottom
		1500 * ms, // capped, top: MaxInterval × (1 + Jitter)
		1000 * ms,
	}, h.clock.sleeps)
	require.Empty(t, randoms, "one random number per wait")
}

func TestStopsAtMaxAttempts(t *testing.T) {
	t.Parallel()

	t.Run("dead-lettered when ShouldDeadLetterFunc accepts the error", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.ShouldDeadLetterFunc = func(err error) bool { return retry.ShouldDeadLetterDefault(err) || errors.Is(err, errPoison) }
		msgs, err := h.handle(t, t.Context(), func(int) error {
			h.clock.Advance(10 * ms) // each attempt takes 10 ms
			return fmt.Errorf("projection orders: %w", errPoison)
		})
		require.NoError(t, err, "a dead-lettered message is acked")
		require.Empty(t, msgs)
		require.Equal(t, retry.MaxAttemptsDefault, h.calls)
		require.Equal(t, []time.Duration{200 * ms, 400 * ms, 800 * ms, 1600 * ms}, h.clock.sleeps)
		attempts, _ := h.retriedAttempts()
		require.Equal(t, []int{1, 2, 3, 4}, attempts)

		require.Len(t, h.deadLetters, 1)
		dl := h.deadLetters[0]
		require.Equal(t, "msg-1", dl.uuid)
		require.ErrorIs(t, dl.err, errPoison)
		g := giveUp(t, dl.err)
		require.Equal(t, retry.StopMaxAttempts, g.Stop)
		require.Equal(t, 5, g.Attempts)
		require.Equal(t, t0.Add(10*ms), g.FirstFailure)
		require.Equal(t, t0.Add(5*10*ms+3000*ms), g.LastFailure)
		require.Equal(t, "retry: gave up after 5 attempts (max_attempts): projection orders: handler cannot project event 7", dl.err.Error())
		require.Equal(t, message.Metadata{
			retry.MetadataReason:       "projection orders: handler cannot project event 7",
			retry.MetadataStop:         "max_attempts",
			retry.MetadataAttempts:     "5",
			retry.MetadataFirstFailure: "2026-11-22T10:00:00.01Z",
			retry.MetadataLastFailure:  "2026-11-22T10:00:03.05Z",
		}, dl.metadata)
	})

	t.Run("returned (nacked) by default", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		_, err := h.handle(t, t.Context(), func(int) error { return errTransient })
		require.ErrorIs(t, err, errTransient)
		g := giveUp(t, err)
		require.Equal(t, retry.StopMaxAttempts, g.Stop)
		require.Equal(t, 5, g.Attempts)
		require.Equal(t, 5, h.calls)
		require.Empty(t, h.deadLetters, "an infrastructure error comes back instead")
	})

	t.Run("one attempt means no retry", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.Policy.MaxAttempts = 1
		_, err := h.handle(t, t.Context(), func(int) error { return errTransient })
		require.Equal(t, "retry: gave up after 1 attempt (max_attempts): database is down", err.Error())
		require.Equal(t, 1, h.calls)
		require.Empty(t, h.clock.sleeps)
	})
}

func TestStopsAtMaxElapsedTime(t *testing.T) {
	t.Parallel()
	// Each attempt takes 100 ms; waits of 200, 400, 800, 1600 ms (no jitter). The attempts fail
	// at 0.1 s, 0.4 s, 0.9 s and 1.8 s; the wait after the third ends at exactly 1.7 s.
	run := func(t *testing.T, limit time.Duration) *harness {
		h := newHarness()
		h.cfg.Policy = retry.Policy{MaxAttempts: 100, Jitter: -1, MaxElapsedTime: limit}
		h.cfg.ShouldDeadLetterFunc = func(error) bool { return true }
		_, err := h.handle(t, t.Context(), func(int) error {
			h.clock.Advance(100 * ms)
			return errPoison
		})
		require.NoError(t, err)
		require.Len(t, h.deadLetters, 1)
		require.Equal(t, retry.StopMaxElapsedTime, giveUp(t, h.deadLetters[0].err).Stop)
		require.Equal(t, "max_elapsed_time", h.deadLetters[0].metadata.Get(retry.MetadataStop))
		return h
	}

	t.Run("a wait ending exactly at the limit is allowed", func(t *testing.T) {
		t.Parallel()
		h := run(t, 1700*ms)
		require.Equal(t, 4, h.calls)
		require.Equal(t, []time.Duration{200 * ms, 400 * ms, 800 * ms}, h.clock.sleeps)
		require.Equal(t, "4", h.deadLetters[0].metadata.Get(retry.MetadataAttempts))
		require.Equal(t, t0.Add(1800*ms), giveUp(t, h.deadLetters[0].err).LastFailure)
	})

	t.Run("a wait ending after the limit is not started", func(t *testing.T) {
		t.Parallel()
		h := run(t, 1700*ms-1)
		require.Equal(t, 3, h.calls)
		require.Equal(t, []time.Duration{200 * ms, 400 * ms}, h.clock.sleeps)
	})

	t.Run("the default limit stops a slow handler before 20 s", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.Policy.MaxAttempts = 100
		_, err := h.handle(t, t.Context(), func(int) error {
			h.clock.Advance(6 * time.Second)
			return errTransient
		})
		g := giveUp(t, err)
		require.Equal(t, retry.StopMaxElapsedTime, g.Stop)
		// Fails at 6 s, 12.2 s, 18.6 s; the next wait (800 ms) would end at 19.4 s: allowed;
		// the fourth attempt fails at 25.4 s, and 1.6 s more is past 20 s.
		require.Equal(t, 4, g.Attempts)
		require.Equal(t, t0.Add(25400*ms), g.LastFailure)
	})

	t.Run("a negative limit means none", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.Policy = retry.Policy{MaxAttempts: 8, MaxElapsedTime: -1}
		_, err := h.handle(t, t.Context(), func(int) error {
			h.clock.Advance(time.Hour)
			return errTransient
		})
		require.Equal(t, retry.StopMaxAttempts, giveUp(t, err).Stop)
		require.Equal(t, 8, h.calls)
	})
}

func TestPermanentErrorIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness()
	h.cfg.ShouldRetryFunc = func(error) bool { return true } // Permanent wins anyway
	_, err := h.handle(t, t.Context(), func(int) error {
		return fmt.Errorf("decode trigger: %w", retry.Permanent(errors.New("unknown version 9")))
	})
	require.NoError(t, err)
	require.Equal(t, 1, h.calls)
	require.Empty(t, h.clock.sleeps)
	require.Empty(t, h.retries)
	require.Len(t, h.deadLetters, 1)
	dl := h.deadLetters[0]
	require.True(t, retry.IsPermanent(dl.err))
	require.Equal(t, retry.StopPermanent, giveUp(t, dl.err).Stop)
	require.Equal(t, "permanent", dl.metadata.Get(retry.MetadataStop))
	require.Equal(t, "1", dl.metadata.Get(retry.MetadataAttempts))
	require.Equal(t, "decode trigger: unknown version 9", dl.metadata.Get(retry.MetadataReason))
	require.Equal(t, dl.metadata.Get(retry.MetadataFirstFailure), dl.metadata.Get(retry.MetadataLastFailure))
}

func TestShouldRetryFalse(t *testing.T) {
	t.Parallel()
	errNoRetry := errors.New("quota exceeded")
	notThat := func(err error) bool { return !errors.Is(err, errNoRetry) }

	t.Run("returned without retry, not dead-lettered", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.ShouldRetryFunc = notThat
		_, err := h.handle(t, t.Context(), func(int) error { return errNoRetry })
		require.ErrorIs(t, err, errNoRetry)
		g := giveUp(t, err)
		require.Equal(t, retry.StopNotRetryable, g.Stop)
		require.Equal(t, 1, g.Attempts)
		require.Equal(t, 1, h.calls)
		require.Empty(t, h.clock.sleeps)
		require.Empty(t, h.deadLetters)
	})

	t.Run("dead-lettered when ShouldDeadLetterFunc says so", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		h.cfg.ShouldRetryFunc = notThat
		h.cfg.ShouldDeadLetterFunc = func(err error) bool { return errors.Is(err, errNoRetry) }
		_, err := h.handle(t, t.Context(), func(int) error { return errNoRetry })
		require.NoError(t, err)
		require.Equal(t, 1, h.calls)
		require.Len(t, h.deadLetters, 1)
		require.Equal(t, "not_retryable", h.deadLetters[0].metadata.Get(retry.MetadataStop))
	})

	t.Run("the default does not retry context errors", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		_, err := h.handle(t, t.Context(), func(int) error {
			return fmt.Errorf("query: %w", context.DeadlineExceeded) // a timeout of the handler's own
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, retry.StopNotRetryable, giveUp(t, err).Stop)
		require.Equal(t, 1, h.calls)
		require.Empty(t, h.deadLetters)
	})
}

func TestPanickingHandler(t *testing.T) {
	t.Parallel()

	t.Run("retried, then dead-lettered once", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		_, err := h.handle(t, t.Context(), func(int) error { panic("nil map in projection orders") })
		require.NoError(t, err)
		require.Equal(t, retry.MaxAttemptsDefault, h.calls)
		require.Len(t, h.clock.sleeps, retry.MaxAttemptsDefault-1)
		require.Len(t, h.deadLetters, 1)

		dl := h.deadLetters[0]
		require.ErrorIs(t, dl.err, retry.ErrPanicked)
		var p *retry.PanicError
		require.ErrorAs(t, dl.err, &p)
		require.Equal(t, "nil map in projection orders", p.Value)
		require.Contains(t, p.Stack, "middleware_test.go", "the stack shows where the handler panicked")
		var wp middleware.RecoveredPanicError
		require.ErrorAs(t, dl.err, &wp, "code written for Watermill's Recoverer still finds it")
		require.Equal(t, p.Value, wp.V)
		require.Equal(t, "retry: handler panicked: nil map in projection orders", dl.metadata.Get(retry.MetadataReason))
		require.Equal(t, "5", dl.metadata.Get(retry.MetadataAttempts))
		require.Equal(t, "max_attempts", dl.metadata.Get(retry.MetadataStop))
		for _, r := range h.retries {
			require.ErrorIs(t, r.Err, retry.ErrPanicked)
		}
	})

	t.Run("a panic, then success", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		msgs, err := h.handle(t, t.Context(), func(attempt int) error {
			if attempt == 1 {
				panic(errors.New("flaky"))
			}
			return nil
		})
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, 2, h.calls)
		require.Empty(t, h.deadLetters)
	})

	t.Run("panicking with context.Canceled is still a panic", func(t *testing.T) {
		t.Parallel()
		h := newHarness()
		_, err := h.handle(t, t.Context(), func(int) error { panic(context.Canceled) })
		require.NoError(t, err)
		require.Equal(t, retry.MaxAttemptsDefault, h.calls)
		require.Len(t, h.deadLetters, 1)
		require.NotErrorIs(t, h.deadLetters[0].err, context.Canceled)
	})
}

func TestContextCanceledDuringBackoff(t *testing.T) {
	t.Parallel()
	h := newHarness()
	// The real clock and sleep: a wait of an hour that only the context can cut short.
	h.cfg.NowFunc, h.cfg.SleepFunc, h.cfg.RandFunc = nil, nil, nil
	h.cfg.Policy = retry.Policy{InitialInterval: time.Hour, MaxElapsedTime: -1}
	h.cfg.ShouldDeadLetterFunc = func(error) bool { return true } // so a wrong dead letter would show
	backingOff := make(chan struct{})
	h.cfg.OnRetryFunc = func(retry.RetryParams) { close(backingOff) }

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	handle := h.handler(t, func(int) error { return errPoison })
	done := make(chan error, 1)
	go func() {
		_, err := handle(ctx)
		done <- err
	}()
	<-backingOff
	cancel()
	var err error
	select {
	case err = <-done: // long before the hour is up
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the retry step kept waiting after the message's context ended")
	}
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errPoison, "the last error is kept for the logs")
	g := giveUp(t, err)
	require.Equal(t, retry.StopCanceled, g.Stop)
	require.Equal(t, 1, g.Attempts)
	require.Equal(t, "retry: stopped after 1 attempt because the message's context ended (context canceled); last error: handler cannot project event 7", err.Error())
	require.Equal(t, 1, h.calls)
	require.Empty(t, h.deadLetters, "a shutdown is not a failure")
}

func TestContextEndedDuringHandler(t *testing.T) {
	t.Parallel()
	h := newHarness()
	h.cfg.ShouldDeadLetterFunc = func(error) bool { return true }
	ctx, cancel := context.WithCancel(t.Context())
	_, err := h.handle(t, ctx, func(int) error {
		cancel() // shutdown mid-handler; the driver reports something else than the context
		return retry.Permanent(errors.New("conn closed"))
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, retry.StopCanceled, giveUp(t, err).Stop)
	require.Equal(t, 1, h.calls)
	require.Empty(t, h.deadLetters, "not even a permanent error is dead-lettered during a shutdown")
}

func TestDeadLetterWriteFails(t *testing.T) {
	t.Parallel()
	h := newHarness()
	h.deadLetterErr = errStore
	_, err := h.handle(t, t.Context(), func(int) error { return retry.Permanent(errPoison) })
	require.Error(t, err, "the message is nacked, so it comes back")
	require.ErrorIs(t, err, errPoison)
	require.ErrorIs(t, err, errStore)
	require.Contains(t, err.Error(), "handler cannot project event 7")
	require.Contains(t, err.Error(), "retry: write the dead letter (the message is nacked): dead-letter table is gone")
	require.Len(t, h.deadLetters, 1, "tried once per delivery")
}

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	cfg := retry.Config{}.WithDefaults()
	require.Equal(t, retry.Policy{}.WithDefaults(), cfg.Policy)
	require.NotNil(t, cfg.ShouldDeadLetterFunc)
	require.NotNil(t, cfg.ShouldRetryFunc)
	require.NotNil(t, cfg.Logger)
	require.NotNil(t, cfg.NowFunc)
	require.NotNil(t, cfg.RandFunc)
	require.NotNil(t, cfg.SleepFunc)

	dl := func(*message.Message, error) error { return nil }
	cases := map[string]struct {
		cfg  retry.Config
		want string
	}{
		"no dead-letter func": {retry.Config{}, "retry: invalid config: Config.DeadLetterFunc is required"},
		"bad policy":          {retry.Config{DeadLetterFunc: dl, Policy: retry.Policy{Multiplier: 0.5}}, "Multiplier is 0.5"},
	}
	for name, c := range cases {
		require.ErrorIs(t, c.cfg.WithDefaults().Validate(), retry.ErrInvalidConfig, name)
		_, err := retry.Middleware(c.cfg)
		require.ErrorIs(t, err, retry.ErrInvalidConfig, name)
		require.ErrorContains(t, err, c.want, name)
	}
	require.ErrorContains(t, retry.Config{DeadLetterFunc: dl}.Validate(), "call WithDefaults first")

	mw, err := retry.Middleware(retry.Config{DeadLetterFunc: dl})
	require.NoError(t, err)
	require.Len(t, mw, 3)
}

func TestStopReasons(t *testing.T) {
	t.Parallel()
	require.Equal(t, []retry.StopReason{"permanent", "not_retryable", "max_attempts", "max_elapsed_time", "canceled"}, retry.StopReasons())
}
