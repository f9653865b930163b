package worker

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/projection"
)

const (
	// safetyNetJitter spreads the ticks of workers started together: each wait is
	// SafetyNetInterval ± this fraction of it.
	safetyNetJitter = 0.1
	// safetyNetFullEvery: a projection the safety net finds with nothing to read is still caught
	// up at every safetyNetFullEvery-th tick (the projections take turns), for what a catch-up
	// does besides reading: an old version's tables dropped once their grace has passed.
	safetyNetFullEvery = 10
)

// netTick is one safety-net tick as one projection sees it.
type netTick struct {
	// status is the projection's status read for the tick (not for a partitioned projection),
	// or err why it could not be read.
	status projection.Status
	err    error
	// full: the projection catches up whatever its status says.
	full bool
}

// needsCatchUp reports whether the tick's catch-up may do anything: a read with events after
// the position, a failure to retry, a rebuild, a version build or retirement, or what the
// status could not tell.
func (t netTick) needsCatchUp() bool {
	st := t.status
	return t.full || t.err != nil || st.LagEvents > 0 || st.HeldByHorizon || st.State != projection.StateRunning ||
		(st.VersionState != "" && st.VersionState != projection.VersionActive)
}

// safetyNet catches every projection up once now, then runs the safety net's ticks until ctx
// ends. Projections run on goroutines of their own, so a slow or failing one does not delay
// the others.
//
// The worker ticks once for all its projections, every SafetyNetInterval (jittered ±10%),
// and reads their statuses together (a few statements with the PostgreSQL backend, whatever
// their number); each projection then checks for a stall and catches up if its status says
// the catch-up may do anything (events to read, a failure to retry, a rebuild, a version
// being built or retired), and at every tenth tick in any case. An idle projection thus costs
// the server a tenth of a catch-up per tick instead of a status read and a catch-up.
func (w *Worker) safetyNet(ctx context.Context) {
	var wg sync.WaitGroup
	ticks := make(map[string]chan netTick, len(w.names))
	for _, name := range w.names {
		tick := make(chan netTick, 1)
		ticks[name] = tick
		wg.Go(func() { w.safetyNetOf(ctx, name, tick) })
	}
	if w.cfg.SafetyNetInterval > 0 {
		wg.Go(func() { w.tickSafetyNet(ctx, ticks) })
	}
	wg.Wait()
}

// tickSafetyNet sends every projection its tick, every SafetyNetInterval (jittered), until ctx
// ends. A projection that has not taken its last tick yet keeps that one.
func (w *Worker) tickSafetyNet(ctx context.Context, ticks map[string]chan netTick) {
	var plain []string // the projections whose statuses the tick reads
	for _, name := range w.names {
		if _, partitioned := w.parts[name]; !partitioned {
			plain = append(plain, name)
		}
	}
	for n := 1; ; n++ {
		wait := time.Duration(float64(w.cfg.SafetyNetInterval) * (1 - safetyNetJitter + 2*safetyNetJitter*rand.Float64()))
		if backoff.Sleep(ctx, wait) != nil {
			return
		}
		statuses, err := w.statusesOf(ctx, plain)
		for i, name := range w.names {
			t := netTick{status: statuses[name], err: err, full: (n+i)%safetyNetFullEvery == 0}
			if _, partitioned := w.parts[name]; partitioned {
				t.full = true
			}
			select {
			case ticks[name] <- t:
			default: // the projection has not taken its last tick yet
			}
		}
		if w.cfg.safetyNetTickFunc != nil {
			w.cfg.safetyNetTickFunc(n)
		}
	}
}

// statusesOf reads the statuses of the projections called names in one call, by name.
func (w *Worker) statusesOf(ctx context.Context, names []string) (map[string]projection.Status, error) {
	statuses := make(map[string]projection.Status, len(names))
	if len(names) == 0 {
		return statuses, nil
	}
	sts, err := w.cfg.Runner.StatusesOf(ctx, names...)
	if err != nil {
		return statuses, err
	}
	for i, name := range names {
		statuses[name] = sts[i]
	}
	return statuses, nil
}

// safetyNetOf is one projection's safety net: at start a catch-up, then at each tick a stall
// check and, if the tick says it may do anything, a catch-up on a goroutine of its own, one at
// a time, so a stuck one does not stop the ticks that report it.
func (w *Worker) safetyNetOf(ctx context.Context, name string, ticks <-chan netTick) {
	log := w.logger.With(slog.String("projection", name))
	ps, partitioned := w.parts[name]
	catchUp := func() error {
		if partitioned {
			return w.catchUpOwned(ctx, ps, log)
		}
		return w.catchUp(ctx, w.handlerOf(name))
	}
	var (
		stall    = stallCheck{since: time.Now()}
		inFlight = make(chan struct{}, 1)
		running  sync.WaitGroup
	)
	defer running.Wait()
	t := netTick{full: true}
	if !partitioned { // a partitioned projection's lag is its partitions' owners', anywhere
		t.status, t.err = w.cfg.Runner.Status(ctx, name)
	}
	for {
		if !partitioned {
			stall.check(ctx, w, name, t.status, t.err, log)
		}
		if t.needsCatchUp() {
			select {
			case inFlight <- struct{}{}:
				running.Go(func() {
					defer func() { <-inFlight }()
					if err := catchUp(); err != nil && ctx.Err() == nil && !errors.Is(err, projection.ErrHandler) {
						log.ErrorContext(ctx, "safety-net catch-up failed", slog.Any("error", err))
					}
				})
			default: // the last one still runs
			}
		}
		select {
		case <-ctx.Done():
			return
		case t = <-ticks:
		}
	}
}
