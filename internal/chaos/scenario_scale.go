package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/lease"
)

// The scale scenario's sizes.
const (
	scalePartitions = 16
	scaleWriters    = 8
	scaleRate       = 2000
	// scalePerAppend is the most events per append (1 to 8, 4.5 on average; a writer behind
	// its share of the rate appends what it owes, up to keepRateMax): 2,000 events/s in
	// appends of 1–3 would be 1,000 commits a second, more than the durable cluster of a
	// shared machine keeps up with.
	scalePerAppend = 8
	scaleWorkers   = 8
	// scaleUnownedBound is the longest a partition may go without a live owner: the bound
	// the leases promise, TTL + renewal (a SIGKILLed worker's leases lapse TTL after its last
	// renewal and the others claim them at once, a round for the lapse being scheduled), plus
	// scaleMonitorSlack for the monitor. Not scaled by timeoutScale: it is the product's.
	scaleUnownedBound = lease.TTLDefault + lease.RenewDefault + scaleMonitorSlack
	// scaleMonitorSlack is what the monitor's measure may add: it errs long by up to a poll
	// (leaseMonitorPoll and the poll's own query, slower on a loaded machine) at either end.
	scaleMonitorSlack = time.Second
	// scaleJoinBound bounds the wait for the leases to converge after workers join or leave
	// gracefully; scaleKillBound after a SIGKILL (the dead worker's leases lapse first).
	scaleJoinBound = 20 * time.Second
	scaleKillBound = 25 * time.Second
)

// scaleScenario: the workers of a partitioned projection scale 1 → 4 → 8 → 2 under load, with
// SIGKILLs, while a monitor watches the lease table.
func scaleScenario() scenario {
	return scenario{
		name: "scale",
		injects: fmt.Sprintf("chaos_exact split into %d partitions (the only projection here), spread over the worker processes by leases "+
			"(TTL %s, renewal %s); %d writers append %d events/s (1–%d per append, more while behind the rate); the workers scale 1 → 4 → 8, then 2 of the 8 are SIGKILLed, "+
			"3 of the 6 left are stopped with SIGTERM and 1 of the 3 left is SIGKILLed, leaving 2; each step is held until "+
			"the leases converge (every partition held by a live worker, counts differing by at most one)",
			scalePartitions, lease.TTLDefault, lease.RenewDefault, scaleWriters, scaleRate, scalePerAppend),
		checks: fmt.Sprintf("every step converges (joins and graceful stops within %s, SIGKILLs within %s); a monitor polling the "+
			"lease table every %s finds no partition without a live owner (none in the table, or a dead worker's) for longer "+
			"than TTL + renewal + 1 s for its polls = %s, and every partition owned again within that bound after each SIGKILL; every event "+
			"in chaos_exact exactly once, with the store's content, in stream order",
			scaleJoinBound, scaleKillBound, leaseMonitorPoll, scaleUnownedBound),
		settings: scenarioSettings{safetyNet: safetyNetDefault, partitions: scalePartitions, exactOnly: true,
			workers: scaleWorkers, writers: scaleWriters, rate: scaleRate, perAppend: scalePerAppend, keepRate: true},
		run:   runScale,
		after: checkScale,
	}
}

// scaleRun is the state of one run of the scale scenario.
type scaleRun struct {
	e   *env
	r   *result
	mon *leaseMonitor
	// live are the slots whose workers run.
	live []*workerSlot
	// steps describe the steps for the notes.
	steps []string
	// joinBound and killBound bound the convergence after joins and graceful stops, and
	// after SIGKILLs (before timeoutScale).
	joinBound, killBound time.Duration
	// readyBound bounds the wait for the workers of a join to be ready (default 60 s).
	readyBound time.Duration
	// oneByOne starts the workers of a join one after the other, each once the previous one
	// is ready (a rolling start): their declarations do not all hit the broker at once.
	oneByOne bool
}

func runScale(ctx context.Context, e *env, r *result) error {
	s := &scaleRun{e: e, r: r, joinBound: scaleJoinBound, killBound: scaleKillBound}
	s.mon = newLeaseMonitor(e.pool, []string{chaosmodel.ExactProjection}, scalePartitions, e.workers.liveOwners, e.log)
	monCtx, stopMonitor := context.WithCancel(ctx)
	var monitoring sync.WaitGroup
	monitoring.Go(func() { s.mon.run(monCtx) })
	defer func() { stopMonitor(); monitoring.Wait() }()

	started := time.Now()
	if err := s.join(ctx, 1); err != nil {
		return err
	}
	loadStarted := time.Now()
	e.scaleStart = loadStarted
	e.load.start(ctx)
	s.mon.arm()
	for _, n := range []int{4, 8} {
		if err := s.join(ctx, n); err != nil {
			return err
		}
	}
	return s.faultsThenVerdict(ctx, func() { stopMonitor(); monitoring.Wait() }, "workers 1 → 4 → 8 → 6 → 3 → 2", scaleRate, started, loadStarted)
}

// faultsThenVerdict runs the scale scenarios' faults — two workers SIGKILLed, three of those
// left stopped with SIGTERM, one more SIGKILLed, each step held until the leases converge —
// then stops the lease monitor (stop) and records its verdict and the writers' rate (target
// rate) since loadStarted; steps names the worker counts for the fault's description.
func (s *scaleRun) faultsThenVerdict(ctx context.Context, stop func(), steps string, rate int, started, loadStarted time.Time) error {
	e, r := s.e, s.r
	if err := s.kill(ctx, 2); err != nil {
		return err
	}
	if err := s.stopGracefully(ctx, 3); err != nil {
		return err
	}
	if err := s.kill(ctx, 1); err != nil {
		return err
	}
	r.FaultKind = fmt.Sprintf("SIGKILLs and %d SIGTERMs, %s", 3, steps)
	e.faultsOver()
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	stop()
	live, slot, table := s.mon.worst()
	r.addCheck("no partition without a live owner longer than the bound", live <= scaleUnownedBound,
		"longest %s (%s), bound %s (TTL %s + renewal %s + 1 s for the polls); without any owner in the table: %s; %d polls, %d failed",
		round(live), s.mon.slotName(slot), scaleUnownedBound, lease.TTLDefault, lease.RenewDefault, round(table), s.mon.polls, s.mon.failures)
	r.Notes = append(r.Notes, s.steps...)
	appended, writing := e.load.ackedCount(), time.Since(loadStarted)
	r.Notes = append(r.Notes, fmt.Sprintf("writers: %d events appended in %s, %.0f events/s (target %d); the steps took %s",
		appended, writing.Round(100*time.Millisecond), float64(appended)/writing.Seconds(), rate, time.Since(started).Round(100*time.Millisecond)))
	return nil
}

// liveOwners returns the ids (lease owners) of the worker incarnations running now.
func (p *pool) liveOwners() map[string]bool {
	out := map[string]bool{}
	for _, s := range p.slots {
		if proc := s.current(); proc != nil && proc.alive() {
			out[proc.id] = true
		}
	}
	return out
}

// owners returns the ids of the live slots' current incarnations.
func (s *scaleRun) owners() []string {
	var out []string
	for _, slot := range s.live {
		if p := slot.current(); p != nil {
			out = append(out, p.id)
		}
	}
	return out
}

// join starts workers until n run, waits until they are ready and the leases have converged,
// and records the rebalance time: from the start of the new processes to convergence.
func (s *scaleRun) join(ctx context.Context, n int) error {
	began := time.Now()
	var procs []*workerProc
	// Each process gets ready within the bound from its own start: one by one, the step
	// takes up to the bound for each.
	awaitReady := func(p *workerProc) error {
		readyCtx, cancel := context.WithDeadline(ctx, p.started.Add(deadline(cmp.Or(s.readyBound, 60*time.Second))))
		defer cancel()
		if err := p.waitReady(readyCtx); err != nil {
			return fmt.Errorf("%s: %w (see its log)", p.id, err)
		}
		return nil
	}
	for _, slot := range s.e.workers.slots[len(s.live):n] {
		p, err := slot.start()
		if err != nil {
			return err
		}
		procs = append(procs, p)
		s.live = append(s.live, slot)
		if s.oneByOne {
			if err := awaitReady(p); err != nil {
				return err
			}
		}
	}
	for _, p := range procs {
		if err := awaitReady(p); err != nil {
			return err
		}
	}
	ready := time.Since(began)
	sp, ok := s.converge(ctx, began, deadline(s.joinBound))
	what := fmt.Sprintf("scale to %d worker(s)", n)
	s.r.addCheck(what+": converges", ok, "%s after the start (ready after %s): %s", round(sp.at.Sub(began)), round(ready), sp)
	s.note(began, "%s: converged %s after the new processes started (ready after %s): %s", what, round(sp.at.Sub(began)), round(ready), sp)
	return nil
}

// kill SIGKILLs n random live workers at once and records the takeover time (from the kill
// until every partition is held by a live worker again) and the time to converge.
func (s *scaleRun) kill(ctx context.Context, n int) error {
	victims := s.pick(n)
	began := time.Now()
	for _, v := range victims {
		if v.kill() {
			s.r.Faults++
		}
	}
	took, owned := s.mon.await(ctx, s.owners(), deadline(s.killBound), func(sp spread) bool { return sp.at.After(began) && sp.allOwned })
	takeover := took.at.Sub(began)
	if !owned {
		takeover = time.Since(began)
	}
	sp, ok := s.converge(ctx, began, deadline(s.killBound))
	what := fmt.Sprintf("SIGKILL of %s, %d left", slotNames(victims), len(s.live))
	s.r.addCheck(what+": every partition owned again within the bound", owned && takeover <= scaleUnownedBound,
		"takeover %s (all owned: %t), bound %s", round(takeover), owned, scaleUnownedBound)
	s.r.addCheck(what+": converges", ok, "%s after the kill: %s", round(sp.at.Sub(began)), sp)
	s.note(began, "%s: every partition owned again %s after the kill, converged after %s: %s", what, round(takeover), round(sp.at.Sub(began)), sp)
	return nil
}

// stopGracefully stops n random live workers with SIGTERM, at once, and records the time
// from the signal to convergence.
func (s *scaleRun) stopGracefully(ctx context.Context, n int) error {
	victims := s.pick(n)
	began := time.Now()
	var wg sync.WaitGroup
	for _, v := range victims {
		wg.Go(func() { v.stop(10 * time.Second) })
	}
	wg.Wait()
	stopped := time.Since(began)
	sp, ok := s.converge(ctx, began, deadline(s.joinBound))
	what := fmt.Sprintf("SIGTERM of %s, %d left", slotNames(victims), len(s.live))
	s.r.addCheck(what+": converges", ok, "%s after the signal (the processes exited after %s): %s", round(sp.at.Sub(began)), round(stopped), sp)
	s.note(began, "%s: converged %s after the signal (the processes exited after %s): %s", what, round(sp.at.Sub(began)), round(stopped), sp)
	return ctx.Err()
}

// converge waits, up to bound, for a poll after began that finds every partition held by a
// live worker and the counts fair.
func (s *scaleRun) converge(ctx context.Context, began time.Time, bound time.Duration) (spread, bool) {
	return s.mon.await(ctx, s.owners(), bound, func(sp spread) bool { return sp.at.After(began) && sp.fair })
}

// pick removes n random slots from the live ones and returns them.
func (s *scaleRun) pick(n int) []*workerSlot {
	var out []*workerSlot
	for range n {
		i := s.e.rng.IntN(len(s.live))
		out = append(out, s.live[i])
		s.live = append(s.live[:i:i], s.live[i+1:]...)
	}
	return out
}

// note records a step begun at began, with its time from the start of the writers.
func (s *scaleRun) note(began time.Time, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if start := s.e.scaleStart; !start.IsZero() && began.After(start) {
		line = fmt.Sprintf("at %s: %s", round(began.Sub(start)), line)
	}
	s.steps = append(s.steps, line)
	s.e.s.progress(s.e.name, "%s", line)
}

func slotNames(slots []*workerSlot) string {
	names := make([]string, len(slots))
	for i, s := range slots {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

// checkScale notes, for the partitions with the longest lags, how long their slowest event
// waited and when it was appended (from the start of the writers), next to the steps' times.
func checkScale(_ context.Context, e *env, r *result) error {
	type worst struct {
		lag time.Duration
		at  time.Duration
	}
	seen := e.verified.seen[chaosmodel.ExactProjection]
	parts := make([]worst, scalePartitions)
	for id, appended := range e.verified.appended {
		s, ok := seen[id]
		if !ok {
			continue
		}
		k := eventstore.PartitionOf(s.Content.Stream, scalePartitions)
		if lag := s.First.Sub(appended); lag > parts[k].lag {
			parts[k] = worst{lag: lag, at: appended.Sub(e.scaleStart)}
		}
	}
	order := make([]int, scalePartitions)
	for k := range order {
		order[k] = k
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(parts[b].lag, parts[a].lag) })
	var desc []string
	for _, k := range order[:3] {
		desc = append(desc, fmt.Sprintf("partition %d: %s (appended at %s)", k, round(parts[k].lag), round(parts[k].at)))
	}
	r.Notes = append(r.Notes, "longest lags: "+strings.Join(desc, "; "))
	return nil
}
