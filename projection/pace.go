package projection

import (
	"context"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
)

const (
	// BuildLagTargetDefault is Config.BuildLagTarget's default: the active version's lag above
	// which a version built beside it slows down. It is about what a live event waits for its
	// batch when nothing else runs, so the build yields as soon as the live events queue
	// behind its work. Measured with `make bench` (-scenario bluegreen, 2026-11-28: a million
	// events built beside a projection taking 1,000 live appends/s on RabbitMQ, 2 cores): with
	// the build's batches sized to half of it and its waits at most 8× a batch, the live p99
	// rose −0 % to +6 % (four runs) and the build ran at 2,100–4,100 events/s; with whole
	// batches of 500 events (and waits up to 32×) it rose 10–16 % at 1,300–1,900 events/s.
	BuildLagTargetDefault = 5 * time.Millisecond
	// buildPauseMax bounds one wait of a paced build between two of its batches: however
	// loaded the active version, the build goes on, a batch at least this often.
	buildPauseMax = time.Second
	// buildPauseRatioMax bounds the wait of a paced build to this many times its last
	// batch's duration: the build then runs 1/(1+buildPauseRatioMax) of the time, 11 %. A live
	// event that meets a build's batch waits for CPU behind it, so the live tail rises with
	// the share of the time the build runs and with the length of its batches: on 2 cores, at
	// 1,000 live appends/s, a build of whole batches (500 events, 10 ms) running 2–5 % of the
	// time raised the live p99 by 5–12 %, one at 20 % by half; a build of batches sized to
	// half the lag target (buildBatchBudgetShare) raised it −0 % to +6 % bounded at 8×
	// (2,100–4,100 events/s, four runs), −11 % to +7 % bounded at 32× (1,000–1,650 events/s,
	// six runs; `make bench`, -scenario bluegreen, 2026-11-28).
	buildPauseRatioMax = 8
	// buildRecovery is what the multiple is multiplied by after a batch that found the live
	// lag under the target: a tenth off, so that the build takes the smallest share as soon
	// as about one batch in ten finds the live projection lagging (a share that keeps the
	// live tail near what it is without a build), and comes back to full speed over a few
	// dozen batches once none does.
	buildRecovery = 0.9
	// buildPauseRatioMin: a multiple below it is none (full speed).
	buildPauseRatioMin = 1.0 / 16
	// buildGainWindow is how often a paced build checks that it gains on the active version:
	// one that did not over a window (closed less of its distance than the active version
	// moved) halves its bound on the ratio for the next one (and runs unpaced, in whole
	// batches, once the bound is under one), one that did doubles it back.
	buildGainWindow = 5 * time.Second
	// buildBatchBudgetShare: while the active version takes live events, a paced build's
	// batches are sized to take about the lag target over this each (2.5 ms at the default
	// 5 ms), within [buildBatchMin, Config.BatchSize]. The live p99 rises with the length of
	// the build's batches as much as with their share of the time: built in batches of 20 or
	// 50 events at full speed, a million events raised it 15–18 %, in batches of 500 70 %, and
	// paced (waits up to 32×), 2.5 ms batches raised it −2 % to +7 % where 500-event ones
	// raised it 10–16 % (`make bench`, -scenario bluegreen, 2026-11-28).
	buildBatchBudgetShare = 2
	// buildBatchMin is the fewest events a paced build's batch is sized to: each batch costs
	// a transaction and its position's update, about a millisecond here.
	buildBatchMin = 10
	// buildIdleAfter: an active version whose position has not moved for this long takes no
	// live events (no worker runs it, or its batch is stuck): its lag is not waited for, and
	// the build's batches grow back (doubling) to Config.BatchSize.
	buildIdleAfter = time.Second
)

// pacer paces a version built beside the active one by the active version's lag, batch by
// batch: after each batch of history it waits a multiple of the batch's duration. The
// multiple doubles (plus one) while the active version's lag, seen when the batch started, is
// over the target, and comes down by a tenth while it is not (buildRecovery): the build backs
// off at once when the live projection falls behind, stays at its smallest share as long as
// about one batch in ten finds it behind, and takes its speed back over a few dozen batches
// once none does — a live projection with nothing to do leaves it to run at full speed.
//
// The pacer also sizes the batches: while the active version takes live events, each batch
// reads about as many events as take the lag target over buildBatchBudgetShare to handle, at
// the rate of the batch before, so a live event never queues behind a long one; once the
// active version has had nothing to do for buildIdleAfter they grow back to Config.BatchSize.
//
// Only a live projection that is working is waited for: when the active version's position
// has not moved for buildIdleAfter (no worker runs it, or its batch is stuck) a wait would
// not bring its lag down, and the build goes on as if it were level.
//
// A paced build must still end: at its smallest share it may run no faster than the live
// events arrive, and never catch up. So every buildGainWindow the pacer compares the build's
// distance to the active version's position (in the store's global positions) with the
// window before. The build gained when it closed at least as much of that distance as the
// active version moved meanwhile (it ran at least twice as fast as the live events arrived):
// a build that gained less would take longer to come level than the gap took to be appended,
// and every extra minute of it is double work beside the live projection, so barely gaining
// is not gaining. A build that did not gain halves the bound on its multiple (limit) for the
// next window, down to none (unpaced, and its batches grow back to Config.BatchSize), and
// one that gained doubles it back, up to buildPauseRatioMax. The build settles at about the
// smallest share that still gains that much — on a machine too busy for any share to, it
// runs unpaced until it is level.
type pacer struct {
	target time.Duration
	ratio  float64
	// batchSize is the projection's Config.BatchSize, size the next batch's limit (0:
	// batchSize) and moved when the active version's position last moved.
	batchSize int
	size      int
	moved     time.Time
	// active is the active version's position the batch before saw; seen once one did.
	active eventstore.Position
	seen   bool
	// waited sums the waits, for the log.
	waited time.Duration
	// window is when the current gain window started, gap the build's distance to the
	// active version then and from the active version's position then; limit bounds ratio
	// through the window (buildPauseRatioMax once the first window starts).
	window    time.Time
	gap, from int64
	limit     float64
}

// next returns how long to wait after a batch of history that handled events in took, saw ver
// and left the build at position at, now.
func (pc *pacer) next(ver VersionInfo, events int, took time.Duration, at eventstore.Position, now time.Time) time.Duration {
	if pc.target < 0 || ver.ActiveState != StateRunning {
		pc.ratio, pc.size = 0, 0 // nothing to protect: an active version that does not run has no live lag to keep low
		return 0
	}
	pc.gaining(ver.ActivePosition.GlobalPosition, at.GlobalPosition, now)
	if !pc.seen || pc.active.Less(ver.ActivePosition) {
		pc.moved = now
	}
	pc.active, pc.seen = ver.ActivePosition, true
	pc.resize(events, took, now)
	if ver.ActiveLag > pc.target && now.Sub(pc.moved) < buildIdleAfter {
		pc.ratio = 2*pc.ratio + 1
	} else {
		pc.ratio *= buildRecovery
	}
	if pc.ratio = min(pc.ratio, pc.limit); pc.ratio < buildPauseRatioMin || pc.limit < 1 {
		pc.ratio = 0
	}
	wait := min(time.Duration(pc.ratio*float64(took)), buildPauseMax)
	pc.waited += wait
	return wait
}

// batchLimit returns the most events the build's next batch reads.
func (pc *pacer) batchLimit() int {
	if pc.size == 0 {
		return pc.batchSize
	}
	return pc.size
}

// resize sizes the next batch after one that handled events in took, now: while the active
// version takes live events, to take about the lag target over buildBatchBudgetShare at the
// last batch's rate (at most double the last size); doubled towards Config.BatchSize once
// its position has not moved for buildIdleAfter, or while the build runs unpaced because it
// did not gain (limit under one).
func (pc *pacer) resize(events int, took time.Duration, now time.Time) {
	last := pc.batchLimit()
	switch {
	case now.Sub(pc.moved) >= buildIdleAfter || pc.limit < 1:
		pc.size = 2 * last
	case events > 0 && took > 0:
		budget := pc.target / buildBatchBudgetShare
		pc.size = min(int(float64(events)*float64(budget)/float64(took)), 2*last)
	default:
		return
	}
	if pc.size = max(pc.size, buildBatchMin); pc.size >= pc.batchSize {
		pc.size = 0
	}
}

// gaining moves limit at the end of each gain window, the active version's position being
// active and the build's at now: halved when the build closed less of its distance to the
// active version over the window than the active version moved (or none of it), doubled (up
// to buildPauseRatioMax) when it closed at least that much.
func (pc *pacer) gaining(active, at int64, now time.Time) {
	gap := active - at
	switch {
	case pc.window.IsZero():
		pc.window, pc.gap, pc.from, pc.limit = now, gap, active, buildPauseRatioMax
	case now.Sub(pc.window) >= buildGainWindow:
		if closed := pc.gap - gap; closed <= 0 || closed < active-pc.from {
			pc.limit /= 2
		} else {
			pc.limit = min(max(2*pc.limit, 1), buildPauseRatioMax)
		}
		pc.window, pc.gap, pc.from = now, gap, active
	}
}

// sleep waits d, or until ctx ends.
func (r *Runner) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
