package worker

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
)

// Waits of the healer after a ResolvePassed that failed: the store is down or partitioned, so
// it is asked again later, not at every catch-up.
const (
	healRetryInitial = time.Second
	healRetryMax     = time.Minute
)

// healer resolves, off the trigger path, the dead letters each projection has passed
// (deadletter.Store.ResolvePassed): the fault was transient and healed by itself, so a replay
// would do nothing. A catch-up that committed events only signals it (signal), so a slow or
// partitioned dead-letter store never delays a trigger's handling. Signals coalesce: however
// many catch-ups committed meanwhile, each projection has one pending resolve, up to its newest
// position. One resolve runs at a time, bounded by DeadLetterTimeout; when one fails the pending
// ones wait, with a growing delay, and are tried again. It runs from the worker's start
// (background) until its context ends, which also cancels the resolve in flight.
//
// It runs after the batch's commit rather than inside its transaction: the dead-letter store is
// a plug-in of its own (in memory, or in another database or schema), and a slow or failing
// write there must neither keep the batch's transaction open (and with it every reader's
// horizon) nor roll the projection's progress back.
type healer struct {
	w    *Worker
	wake chan struct{} // holds a token while signals wait for run
	// retryInitial and retryMax are the waits after a failure (healRetryInitial, healRetryMax).
	retryInitial, retryMax time.Duration

	mu      sync.Mutex
	pending map[string]eventstore.Position // by projection (or partition unit)
}

func newHealer(w *Worker) *healer {
	return &healer{w: w, wake: make(chan struct{}, 1), retryInitial: healRetryInitial, retryMax: healRetryMax,
		pending: map[string]eventstore.Position{}}
}

// signal asks for name's dead letters whose failing event pos has passed to be resolved. It
// never blocks.
func (h *healer) signal(name string, pos eventstore.Position) {
	if pos.IsZero() {
		return
	}
	h.merge(map[string]eventstore.Position{name: pos})
	select {
	case h.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// merge adds positions to the pending ones, keeping the newer of two.
func (h *healer) merge(positions map[string]eventstore.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, pos := range positions {
		if cur, ok := h.pending[name]; !ok || cur.Less(pos) {
			h.pending[name] = pos
		}
	}
}

// take returns the pending positions and clears them.
func (h *healer) take() map[string]eventstore.Position {
	h.mu.Lock()
	defer h.mu.Unlock()
	taken := h.pending
	h.pending = map[string]eventstore.Position{}
	return taken
}

// run resolves what is signalled until ctx ends. After a failed resolve it waits (doubling from
// retryInitial up to retryMax) before it tries again, whatever is signalled meanwhile.
func (h *healer) run(ctx context.Context) {
	wait := backoff.Exponential{Initial: h.retryInitial, Max: h.retryMax, Jitter: 0.2}
	var retry <-chan time.Time
	for {
		if retry == nil {
			select {
			case <-ctx.Done():
				return
			case <-h.wake:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-retry:
			}
		}
		if h.resolvePending(ctx) {
			wait.Reset()
			retry = nil
			continue
		}
		d := wait.Next()
		h.w.logger.DebugContext(ctx, "resolving healed dead letters waits before it tries again", slog.Duration("wait", d))
		retry = time.After(d)
	}
}

// resolvePending resolves the pending positions, one projection at a time. At the first
// failure it puts that one and those not reached back and reports false.
func (h *healer) resolvePending(ctx context.Context) bool {
	pending := h.take()
	names := slices.Sorted(maps.Keys(pending))
	for i, name := range names {
		if h.resolve(ctx, name, pending[name]) {
			continue
		}
		rest := map[string]eventstore.Position{}
		for _, n := range names[i:] {
			rest[n] = pending[n]
		}
		h.merge(rest)
		return false
	}
	return true
}

// resolve resolves name's dead letters that pos has passed, within DeadLetterTimeout, and
// reports whether the store answered.
func (h *healer) resolve(parent context.Context, name string, pos eventstore.Position) bool {
	w := h.w
	log := w.logger.With(slog.String("projection", name))
	ctx, cancel := context.WithTimeout(parent, w.cfg.DeadLetterTimeout)
	defer cancel()
	n, err := w.cfg.DeadLetters.ResolvePassed(ctx, name, pos, time.Now())
	switch {
	case err != nil:
		if parent.Err() == nil {
			log.WarnContext(ctx, "could not resolve the dead letters the projection has passed; tried again later",
				slog.String("position", pos.String()), slog.Any("error", err))
		}
		return false
	case n > 0:
		w.stats[name].healed.Add(int64(n))
		log.InfoContext(ctx, "dead letters healed: the projection passed their failing events by itself",
			slog.Int("records", n), slog.String("position", pos.String()))
	}
	return true
}
