package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// Defaults for PollerConfig.
const (
	// PollMinIntervalDefault is the wait after a catch-up that found work.
	PollMinIntervalDefault = 100 * time.Millisecond
	// PollMaxIntervalDefault caps the wait while a projection is idle.
	PollMaxIntervalDefault = 5 * time.Second
	// PollMaxFailureIntervalDefault caps the wait while a projection keeps failing.
	PollMaxFailureIntervalDefault = time.Minute
	// PollListeningMaxIntervalDefault caps the wait while a projection is idle and its
	// Waker listens: the poll is then only a fallback.
	PollListeningMaxIntervalDefault = 30 * time.Second
)

// Waker wakes a poller when events may have been appended; postgres.Listener is one (on
// postgres.NotifyEvents).
type Waker interface {
	// Subscribe returns a channel that receives after appends and whenever Listening
	// changes, and a function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
	// Listening reports whether wake-ups arrive now; while it is false the poller polls on
	// MaxInterval.
	Listening() bool
}

// PollerConfig configures a Poller. Every field is optional.
type PollerConfig struct {
	// MinInterval is the wait after a catch-up that handled events. Defaults to
	// PollMinIntervalDefault.
	MinInterval time.Duration
	// MaxInterval caps the wait while idle: each catch-up that finds nothing doubles the wait,
	// up to this. Defaults to PollMaxIntervalDefault.
	MaxInterval time.Duration
	// MaxFailureInterval caps the wait while failing: each failed catch-up doubles the wait,
	// up to this. Defaults to PollMaxFailureIntervalDefault.
	MaxFailureInterval time.Duration
	// MaxBusyInterval, when above MinInterval, stretches the wait after work with the work
	// done: MinInterval after a catch-up that handled a few events, growing linearly to
	// MaxBusyInterval after one that handled a full batch (Config.BatchSize) or more. Under a
	// heavy load each catch-up then covers more events in fewer, fuller batches (a trigger
	// relay publishes fewer triggers), while a light load keeps the short wait. Defaults to
	// MinInterval: no stretching.
	MaxBusyInterval time.Duration
	// Waker, if set, wakes the poller when events are appended: an idle projection then
	// catches up at once instead of at the end of its wait, and while the Waker listens the
	// idle wait grows up to ListeningMaxInterval instead of MaxInterval, so an idle projection
	// costs next to no queries. A wake-up cuts an idle wait short, never the wait after work
	// (MinInterval, MaxBusyInterval), so a busy projection still batches.
	Waker Waker
	// ListeningMaxInterval caps the idle wait while Waker listens. Defaults to
	// PollListeningMaxIntervalDefault, or MaxInterval if that is longer.
	ListeningMaxInterval time.Duration
	// Logger receives the poller's structured logs. NewPoller defaults it to the runner's
	// logger (WithDefaults alone, to slog.Default()).
	Logger *slog.Logger
	// AfterPollFunc, if set, is called after every catch-up with what happened and the wait
	// chosen. It runs on the projection's polling goroutine.
	AfterPollFunc func(p PollParams)
	// WaitedFunc, if set, is called after every catch-up of the named projection and returns
	// how long that catch-up already waited on a hop that spaces catch-ups out as the wait after
	// work does: a trigger relay's publish waiting for the broker's confirm (package relay).
	// The wait after work (MinInterval, MaxBusyInterval) is shortened by it, to no less than
	// zero, so that a slow hop is not waited for twice; the idle and failure waits are not.
	// It runs on the projection's polling goroutine.
	WaitedFunc func(projection string) time.Duration
}

// PollParams describes one poll, for PollerConfig.AfterPollFunc.
type PollParams struct {
	Projection string
	Result     Result
	Err        error
	// Next is how long the poller waits before the next catch-up.
	Next time.Duration
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg PollerConfig) WithDefaults() PollerConfig {
	cfg.MinInterval = cmp.Or(cfg.MinInterval, PollMinIntervalDefault)
	cfg.MaxInterval = cmp.Or(cfg.MaxInterval, PollMaxIntervalDefault)
	cfg.MaxFailureInterval = cmp.Or(cfg.MaxFailureInterval, PollMaxFailureIntervalDefault)
	cfg.MaxBusyInterval = cmp.Or(cfg.MaxBusyInterval, cfg.MinInterval)
	cfg.ListeningMaxInterval = cmp.Or(cfg.ListeningMaxInterval, max(PollListeningMaxIntervalDefault, cfg.MaxInterval))
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg PollerConfig) Validate() error {
	if cfg.MinInterval <= 0 || cfg.MaxInterval < cfg.MinInterval || cfg.MaxFailureInterval < cfg.MinInterval || cfg.MaxBusyInterval < cfg.MinInterval {
		return fmt.Errorf("%w: poller intervals must satisfy 0 < MinInterval <= MaxInterval and MinInterval <= MaxFailureInterval, MaxBusyInterval "+
			"(got %s, %s, %s, %s; 0 means the default)",
			ErrInvalidConfig, cfg.MinInterval, cfg.MaxInterval, cfg.MaxFailureInterval, cfg.MaxBusyInterval)
	}
	if cfg.ListeningMaxInterval < cfg.MaxInterval {
		return fmt.Errorf("%w: ListeningMaxInterval %s is below MaxInterval %s: the poll while listening is a fallback, never more frequent (0 means the default)",
			ErrInvalidConfig, cfg.ListeningMaxInterval, cfg.MaxInterval)
	}
	return nil
}

// Poller runs catch-up on an adaptive interval, with no broker: the polling mode. Each
// projection polls on a goroutine of its own, so a failing or slow projection never delays
// another. While a projection is idle its interval doubles up to MaxInterval; while it fails,
// up to MaxFailureInterval; after work it drops back to MinInterval (or, with MaxBusyInterval,
// to a wait that grows with the work done), less what the catch-up waited (WaitedFunc).
type Poller struct {
	runner *Runner
	cfg    PollerConfig
	names  []string
	wake   map[string]chan struct{}
	// running is set while Run runs.
	running atomic.Bool
}

// NewPoller returns a poller for the named projections of r (all of them when names is empty).
func NewPoller(r *Runner, cfg PollerConfig, names ...string) (*Poller, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: NewPoller needs a runner, got nil", ErrInvalidConfig)
	}
	cfg.Logger = cmp.Or(cfg.Logger, r.logger)
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		names = r.Names()
	}
	for _, name := range names {
		if _, err := r.Projection(name); err != nil {
			return nil, err
		}
	}
	wake := make(map[string]chan struct{}, len(names))
	for _, name := range names {
		wake[name] = make(chan struct{}, 1)
	}
	return &Poller{runner: r, cfg: cfg, names: names, wake: wake}, nil
}

// Run polls until ctx ends, then waits for the catch-ups in flight to stop (they roll back) and
// returns nil. A Run while another has not returned yet fails with ErrAlreadyRunning; after it
// has, Run starts polling again.
func (p *Poller) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return fmt.Errorf("poller: %w", ErrAlreadyRunning)
	}
	defer p.running.Store(false)
	var wg sync.WaitGroup
	for _, name := range p.names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.poll(ctx, name)
		}()
	}
	wg.Wait()
	return nil
}

// Wake makes every projection of the poller catch up now instead of at the end of its wait
// (a failing projection too). It never blocks.
func (p *Poller) Wake() {
	for _, ch := range p.wake {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (p *Poller) poll(ctx context.Context, name string) {
	// While idle the wait doubles from MinInterval (its first is twice it), while failing from
	// MinInterval; work resets both.
	idle := backoff.Exponential{Initial: min(2*p.cfg.MinInterval, p.cfg.MaxInterval), Max: p.cfg.MaxInterval}
	failing := backoff.Exponential{Initial: p.cfg.MinInterval, Max: p.cfg.MaxFailureInterval}
	proj, _ := p.runner.Projection(name) // NewPoller checked the name
	batch := proj.Config().BatchSize
	var woken <-chan struct{}
	if p.cfg.Waker != nil {
		ch, stop := p.cfg.Waker.Subscribe()
		defer stop()
		woken = ch
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	busy := false
	for {
		woke, ok := p.wait(ctx, timer, p.wake[name], woken, busy)
		if !ok {
			return
		}
		if woke {
			// Events may be on their way but not readable yet (an older transaction still
			// runs): the idle waits start short again.
			idle.Reset()
		}
		res, err := p.runner.CatchUp(ctx, name)
		if ctx.Err() != nil {
			return
		}
		var waited time.Duration
		if p.cfg.WaitedFunc != nil {
			waited = p.cfg.WaitedFunc(name)
		}
		var next time.Duration
		busy = false
		switch {
		case err != nil:
			next = failing.Next()
			idle.Reset()
			if !errors.Is(err, ErrHandler) { // handler failures are logged by the runner
				p.cfg.Logger.ErrorContext(ctx, "projection catch-up failed", slog.String("projection", name),
					slog.Any("error", err), slog.Duration("retry_in", next))
			}
		case res.Events > 0:
			next, busy = max(p.busyInterval(res.Events, batch)-waited, 0), true
			idle.Reset()
			failing.Reset()
		default:
			idle.Max = p.idleMax()
			next = idle.Next()
			failing.Reset()
		}
		if p.cfg.AfterPollFunc != nil {
			p.cfg.AfterPollFunc(PollParams{Projection: name, Result: res, Err: err, Next: next})
		}
		timer.Reset(next)
	}
}

// wait waits for the timer, a Wake, or (unless busy: the wait after work is never cut short)
// a wake-up from the Waker. woke says whether a wake-up ended the wait; ok is false when ctx
// ended.
func (p *Poller) wait(ctx context.Context, timer *time.Timer, wake, woken <-chan struct{}, busy bool) (woke, ok bool) {
	if busy {
		woken = nil // a pending wake-up stays in its channel for the next idle wait
	}
	select {
	case <-ctx.Done():
		return false, false
	case <-timer.C:
		return false, true
	case <-wake:
	case <-woken:
	}
	timer.Stop()
	return true, true
}

// idleMax caps the idle wait: ListeningMaxInterval while the Waker listens, else MaxInterval.
func (p *Poller) idleMax() time.Duration {
	if p.cfg.Waker != nil && p.cfg.Waker.Listening() {
		return p.cfg.ListeningMaxInterval
	}
	return p.cfg.MaxInterval
}

// busyInterval is the wait after a catch-up that handled events, for a projection whose batches
// hold batch events: see PollerConfig.MaxBusyInterval.
func (p *Poller) busyInterval(events, batch int) time.Duration {
	stretch := p.cfg.MaxBusyInterval - p.cfg.MinInterval
	return p.cfg.MinInterval + stretch*time.Duration(min(events, batch))/time.Duration(batch)
}
