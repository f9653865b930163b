package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/worker"
)

// The scale-out targets (issue 19). On two cores CPU-bound handlers cannot scale, so the
// speed-up is measured with handlers that wait scaleOutWait per event, as for a remote call.
var (
	targetScaleOut = Target{Name: "catch-up speed-up of 16 partitions on 4 workers (2 ms per event), of the unpartitioned projection on 1 worker",
		Op: AtLeast, Threshold: 3.5, Unit: "×"}
	targetPartitionCost = Target{Name: "cost of partitioning: catch-up time of 16 partitions on 1 worker (no wait per event), over the unpartitioned projection's",
		Op: AtMost, Threshold: 10, Unit: "%"}
)

const (
	// scaleOutPartitions is the partitioned projection's Config.Partitions.
	scaleOutPartitions = 16
	// scaleOutStreams is how many streams the backlog spreads over.
	scaleOutStreams = 10_000
	// scaleOutWait is the handler's wait per event: a remote call.
	scaleOutWait = 2 * time.Millisecond
	// scaleOutRenew and scaleOutTTL are the workers' lease timings: shorter than the defaults
	// (1.5 s, 6 s), so that workers starting together converge on their fair shares in a few
	// hundred milliseconds.
	scaleOutRenew = 200 * time.Millisecond
	scaleOutTTL   = 2 * time.Second
)

// scaleOutCase is one catch-up of the loaded backlog by a fresh projection.
type scaleOutCase struct {
	partitions int           // Config.Partitions
	workers    int           // workers in this process; 0: Runner.CatchUp in the caller's goroutine
	wait       time.Duration // the handler's wait per event
	atOnce     int           // each worker's MaxConcurrentPartitions (0: every partition it owns)
	// prefix, if not 0, ends the catch-up once this many events are committed: the case is
	// measured over the backlog's first events only (its rate; its workers are stopped then).
	prefix int
}

func (c scaleOutCase) label() string {
	var s string
	if c.partitions > 1 {
		s = fmt.Sprintf("%d partitions", c.partitions)
	} else {
		s = "unpartitioned"
	}
	switch {
	case c.workers == 0 && c.partitions > 1:
		s += ", Runner.CatchUp (one partition after another)"
	case c.workers == 0:
		s += ", Runner.CatchUp"
	case c.workers == 1:
		s += ", 1 worker"
	default:
		s += fmt.Sprintf(", %d workers", c.workers)
	}
	if c.atOnce > 0 {
		s += fmt.Sprintf(", each %d partitions at once", c.atOnce)
	}
	if c.prefix > 0 {
		s += fmt.Sprintf(", first %s events", Thousands(int64(c.prefix)))
	}
	return s
}

// scaleOutResult is what one case took.
type scaleOutResult struct {
	took   time.Duration
	events int // committed within took: the whole backlog, or at least a prefix case's prefix
	// converged is when, after the workers' start, each of them first owned its fair share
	// of the partitions; 0 when not measured (no workers, or it never happened).
	converged time.Duration
}

func (r scaleOutResult) rate() float64 { return Rate(r.events, r.took) }

// backlogTime is the time the whole backlog of n events takes at the result's rate: the time
// measured when the result covers them all, else an estimate from a prefix's rate.
func (r scaleOutResult) backlogTime(n int) time.Duration {
	if r.events >= n {
		return r.took
	}
	return time.Duration(float64(r.took) * float64(n) / float64(max(r.events, 1)))
}

// scaleOutProjection is a ticket_list read model written per event (OnQueued, the batch's
// statements in one round trip, exactly once with the batch), whose handler first waits wait.
func scaleOutProjection(name string, partitions int, wait time.Duration) (*projection.Projection, error) {
	upsert := ticketUpsertSQL(name)
	cfg := ticketConfig(name, 0)
	cfg.Partitions = partitions
	return projection.New(name, cfg,
		projection.OnQueued(rebuildEventType, func(_ context.Context, q *projection.Queue, e projection.Event[ticketRegistered]) error {
			if wait > 0 {
				time.Sleep(wait) // the remote call
			}
			q.Queue(upsert, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
			return nil
		}))
}

// scaleOutRun is the state of one scale-out scenario: the loaded fixture and the channel.
type scaleOutRun struct {
	h *harness
	f *fixture
	w *wiring
}

func runScaleOut(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["partitions"] = sz.scaleOutEvents, scaleOutStreams, scaleOutPartitions
	sec.Params["wait_ms"], sec.Params["workers"], sec.Params["cost_rounds"] = Ms(scaleOutWait), sz.scaleOutWorkers, sz.scaleOutRounds
	sec.Params["unpartitioned_wait_events"] = min(sz.scaleOutFlatEvents, sz.scaleOutEvents)
	sec.Params["batch_size"] = projection.BatchSizeDefault
	table := &Table{Header: []string{"case", "events/s", "seconds", "vs unpartitioned", "vs 1 worker", "fair shares after s"}}
	sec.table = table

	f, err := h.newFixture(ctx, 8)
	if err != nil {
		return err
	}
	defer f.close()
	last, err := loadEvents(f.db.pool, sz.scaleOutEvents, scaleOutStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	started := time.Now()
	if err := f.store.EnsurePartitions(ctx, scaleOutPartitions); err != nil {
		return err
	}
	sec.Note("EnsurePartitions(%d) built its index over %s events in %s, before the cases (Runner.Init would build it otherwise)",
		scaleOutPartitions, Thousands(int64(sz.scaleOutEvents)), time.Since(started).Round(time.Millisecond))
	if _, err := f.db.pool.Exec(ctx, `VACUUM ANALYZE nudge_events`); err != nil {
		return err
	}
	ch, err := gochannel.New(gochannel.Config{})
	if err != nil {
		return err
	}
	// The backlog is loaded: the workers' start-up catch-ups do the work, no trigger is
	// published (no relay).
	run := &scaleOutRun{h: h, f: f, w: &wiring{kind: chGoChannel, ch: ch, store: f.store, ownRelay: true, cleanup: func() {}}}
	defer run.w.close()

	if err := run.measureCost(ctx, sec, table); err != nil {
		return fmt.Errorf("partitioning cost: %w", err)
	}
	return run.measureScale(ctx, sec, table)
}

// measureCost catches the backlog up without a wait per event, unpartitioned and in 16
// partitions, in alternating rounds, and reports the medians: what partitioning itself costs.
func (r *scaleOutRun) measureCost(ctx context.Context, sec *Section, table *Table) error {
	cases := []scaleOutCase{{partitions: 1, workers: 1}, {partitions: scaleOutPartitions, workers: 1}, {partitions: scaleOutPartitions}}
	took := make([][]time.Duration, len(cases))
	for range r.h.sizes.scaleOutRounds {
		for i, c := range cases {
			res, err := r.catchUp(ctx, c)
			if err != nil {
				return fmt.Errorf("%s: %w", c.label(), err)
			}
			took[i] = append(took[i], res.took)
			r.h.log.InfoContext(ctx, "scaleout: cost case done", slog.String("case", c.label()), slog.Float64("events_per_s", res.rate()))
		}
	}
	n := r.h.sizes.scaleOutEvents
	base := medianDuration(took[0])
	baseCase := "no wait: " + cases[0].label()
	sec.AddMetric(Metric{Case: baseCase, Name: "events_per_s", Unit: "events/s", Value: Rate(n, base), Extra: map[string]float64{"seconds": base.Seconds()}})
	table.Add(baseCase, FormatValue(Rate(n, base), ""), FormatValue(base.Seconds(), "s"), "", "")
	for i, c := range cases[1:] {
		d := medianDuration(took[i+1])
		label := "no wait: " + c.label()
		m := Metric{Case: label, Name: "events_per_s", Unit: "events/s", Value: Rate(n, d),
			Extra: map[string]float64{"seconds": d.Seconds(), "time_ratio": Ratio(d.Seconds(), base.Seconds())}}.WithBaseline(baseCase, Rate(n, base))
		sec.AddMetric(m)
		table.Add(label, FormatValue(m.Value, ""), FormatValue(d.Seconds(), "s"), FormatValue(m.Ratio, "×"), "")
		if c.workers == 1 {
			sec.AddCheck(targetPartitionCost, label, 100*(Ratio(d.Seconds(), base.Seconds())-1))
		}
	}
	sec.Note("no wait: the handler writes its row at once (CPU and database bound); median of %d round(s), the cases alternating, each a fresh projection "+
		"over the same events; the target compares the catch-up times of the first two rows; Runner.CatchUp of the partitioned projection catches its "+
		"partitions up one after another in one goroutine: the partitioned reads' own cost, without the worker's concurrency", r.h.sizes.scaleOutRounds)
	return nil
}

// measureScale catches the backlog up with a wait of scaleOutWait per event: unpartitioned on
// one worker, then in 16 partitions on each count of workers.
func (r *scaleOutRun) measureScale(ctx context.Context, sec *Section, table *Table) error {
	n := r.h.sizes.scaleOutEvents
	flat := scaleOutCase{partitions: 1, workers: 1, wait: scaleOutWait}
	if p := r.h.sizes.scaleOutFlatEvents; p > 0 && p < n {
		flat.prefix = p
	}
	base, err := r.catchUp(ctx, flat)
	if err != nil {
		return fmt.Errorf("%s: %w", flat.label(), err)
	}
	baseCase := "2 ms/event: " + flat.label()
	seconds := FormatValue(base.took.Seconds(), "s")
	extra := map[string]float64{"seconds": base.backlogTime(n).Seconds()}
	if flat.prefix > 0 {
		seconds = "≈" + FormatValue(base.backlogTime(n).Seconds(), "s") + " (est.)"
		extra["measured_events"], extra["measured_s"], extra["seconds_estimated"] = float64(base.events), base.took.Seconds(), 1
	}
	sec.AddMetric(Metric{Case: baseCase, Name: "events_per_s", Unit: "events/s", Value: base.rate(), Extra: extra})
	table.Add(baseCase, FormatValue(base.rate(), ""), seconds, "1.0×", "")
	r.h.log.InfoContext(ctx, "scaleout: unpartitioned done", slog.Float64("events_per_s", base.rate()))
	if flat.prefix > 0 {
		sec.Note("unpartitioned with 2 ms/event: measured over the backlog's first %s events (%s committed in %.1f s, from the worker's start), "+
			"its workers then stopped; its seconds for all %s events are estimated from that rate (the wait per event is fixed, so the rate "+
			"is steady: one batch of %d events after another, in one goroutine); the partitioned cases catch up all %s",
			Thousands(int64(flat.prefix)), Thousands(int64(base.events)), base.took.Seconds(), Thousands(int64(n)), projection.BatchSizeDefault,
			Thousands(int64(n)))
	}
	series := workerSeries{base: base, baseCase: baseCase}
	for _, n := range r.h.sizes.scaleOutWorkers {
		c := scaleOutCase{partitions: scaleOutPartitions, workers: n, wait: scaleOutWait}
		m, err := r.seriesCase(ctx, sec, table, &series, c)
		if err != nil {
			return err
		}
		if n == 4 {
			sec.AddCheck(targetScaleOut, m.Case, m.Ratio)
		}
	}
	sec.Note("2 ms/event: the handler waits %s (time.Sleep, a remote call) before queuing its row; time from the workers' start until every event is committed, "+
		"the read model checked after; GoChannel, no triggers: each worker's start-up catch-up of the partitions it owns does the work", scaleOutWait)
	largest := slices.Max(partitionSizes(r.h.sizes.scaleOutEvents, scaleOutStreams, scaleOutPartitions))
	perEvent := base.took / time.Duration(max(base.events, 1))
	floor := time.Duration(largest) * perEvent
	sec.Params["largest_partition_events"] = largest
	sec.Note("floor: the largest of the %d partitions holds %s of the %s events (the mean is %s): at the unpartitioned case's %.2f ms per event, its "+
		"catch-up alone takes %.1f s, the bound of every partitioned case (a speed-up of at most %.1f×)", scaleOutPartitions, Thousands(int64(largest)),
		Thousands(int64(r.h.sizes.scaleOutEvents)), Thousands(int64(r.h.sizes.scaleOutEvents/scaleOutPartitions)), Ms(perEvent), floor.Seconds(),
		Ratio(base.backlogTime(r.h.sizes.scaleOutEvents).Seconds(), floor.Seconds()))
	sec.Note("vs 1 worker: a worker catches up each partition it owns in a goroutine of its own, so 1 worker already runs the %d partitions side by side; "+
		"with handlers waiting on a remote call, more workers add no parallelism (it is the partition count) until one worker's CPU or connections "+
		"hold it back. So the target's baseline is the unpartitioned projection on 1 worker, not 1 worker of the partitioned one", scaleOutPartitions)
	sec.Note("fair shares after: from the workers' start, all at once, until each first held its fair share (leases renewed every %s, TTL %s); "+
		"the first worker to run claims every partition and gives the others theirs only between batches (%d events, about %.1f s each here): "+
		"the times include this convergence", scaleOutRenew, scaleOutTTL, projection.BatchSizeDefault,
		(time.Duration(projection.BatchSizeDefault) * perEvent).Seconds())
	sec.Note("each worker: a pool of its fair share of the partitions (or of its %d at once) + 3 connections for its runner; the worker renews "+
		"its leases on a pool of 2 of its own (on the runner's pool, the first worker's renewals waited behind its batches for every partition "+
		"and its leases lapsed after their TTL, all moving at once)", scaleOutAtOnce)
	return r.measureBounded(ctx, sec, table, base, baseCase)
}

// workerSeries is a series of worker counts measured against the unpartitioned baseline and
// against its own first (1-worker) case.
type workerSeries struct {
	base     scaleOutResult
	baseCase string
	one      *scaleOutResult
}

// seriesCase measures c, one case of series, and adds its metric and row.
func (r *scaleOutRun) seriesCase(ctx context.Context, sec *Section, table *Table, series *workerSeries, c scaleOutCase) (Metric, error) {
	res, err := r.catchUp(ctx, c)
	if err != nil {
		return Metric{}, fmt.Errorf("%s: %w", c.label(), err)
	}
	label := "2 ms/event: " + c.label()
	m := Metric{Case: label, Name: "events_per_s", Unit: "events/s", Value: res.rate(),
		Extra: map[string]float64{"seconds": res.took.Seconds(), "workers": float64(c.workers), "fair_shares_s": res.converged.Seconds()}}.WithBaseline(series.baseCase, series.base.rate())
	vsOne := ""
	if series.one == nil {
		series.one = &res
	} else {
		m.Extra["vs_1_worker"] = Ratio(res.rate(), series.one.rate())
		vsOne = FormatValue(m.Extra["vs_1_worker"], "×")
	}
	sec.AddMetric(m)
	converged := "—"
	if res.converged > 0 {
		converged = FormatValue(res.converged.Seconds(), "s")
	}
	table.Add(label, FormatValue(res.rate(), ""), FormatValue(res.took.Seconds(), "s"), FormatValue(m.Ratio, "×"), vsOne, converged)
	r.h.log.InfoContext(ctx, "scaleout: case done", slog.String("case", label), slog.Float64("events_per_s", res.rate()))
	return m, nil
}

// scaleOutAtOnce is each worker's MaxConcurrentPartitions in the bounded cases: the
// connections a worker of pgxpool's default size (4 on a 2-core machine) can give its batches.
const scaleOutAtOnce = 4

// measureBounded catches the backlog up with workers that each run at most scaleOutAtOnce
// partitions' batches at once (worker.Config.MaxConcurrentPartitions), 1, 2 and 4 of them: where
// one worker's connections bind, more workers add parallelism.
func (r *scaleOutRun) measureBounded(ctx context.Context, sec *Section, table *Table, base scaleOutResult, baseCase string) error {
	series := workerSeries{base: base, baseCase: baseCase}
	for _, n := range r.h.sizes.scaleOutWorkers {
		if n > scaleOutPartitions/scaleOutAtOnce {
			continue // more workers than it takes to run every partition at once
		}
		c := scaleOutCase{partitions: scaleOutPartitions, workers: n, wait: scaleOutWait, atOnce: scaleOutAtOnce}
		if _, err := r.seriesCase(ctx, sec, table, &series, c); err != nil {
			return err
		}
	}
	sec.Note("each %d partitions at once: worker.Config.MaxConcurrentPartitions %d (a slot per batch, so every owned partition takes its turn); "+
		"vs 1 worker is the scale-out where one worker's connections bind: 1 worker runs 4 of the 16 partitions at a time, 4 workers all 16, "+
		"up to the largest partition's floor", scaleOutAtOnce, scaleOutAtOnce)
	return nil
}

// partitionSizes returns how many of eventload's events (event i is on stream i%streams) each
// of count partitions holds.
func partitionSizes(events, streams, count int) []int {
	sizes := make([]int, count)
	for s := range min(events, streams) {
		sizes[eventstore.PartitionOf(eventloadStream(s), count)] += (events - s + streams - 1) / streams
	}
	return sizes
}

// catchUp defines a fresh projection for c, catches the loaded backlog up as c says and
// checks the read model it built.
func (r *scaleOutRun) catchUp(ctx context.Context, c scaleOutCase) (scaleOutResult, error) {
	name := fmt.Sprintf("so%d_p%d_w%d", r.h.next(), c.partitions, c.workers)
	var (
		res scaleOutResult
		err error
	)
	if c.workers == 0 {
		res, err = r.catchUpInline(ctx, name, c)
	} else {
		res, err = r.catchUpWorkers(ctx, name, c)
	}
	if err != nil {
		return res, err
	}
	if c.prefix > 0 {
		return res, nil // catchUpWorkers checked the read model of the events it committed
	}
	return res, r.f.checkTickets(ctx, name, r.h.sizes.scaleOutEvents, scaleOutStreams)
}

// catchUpInline catches the projection up with Runner.CatchUp.
func (r *scaleOutRun) catchUpInline(ctx context.Context, name string, c scaleOutCase) (scaleOutResult, error) {
	p, err := scaleOutProjection(name, c.partitions, c.wait)
	if err != nil {
		return scaleOutResult{}, err
	}
	runner, err := projection.NewRunner(r.f.backend, projection.RunnerConfig{Logger: r.h.libLog}, p)
	if err != nil {
		return scaleOutResult{}, err
	}
	if err := runner.Init(ctx); err != nil {
		return scaleOutResult{}, err
	}
	started := time.Now()
	cu, err := runner.CatchUp(ctx, name)
	res := scaleOutResult{took: time.Since(started), events: cu.Events}
	if err != nil {
		return res, err
	}
	if cu.Events != r.h.sizes.scaleOutEvents {
		return res, fmt.Errorf("handled %d events, want %d", cu.Events, r.h.sizes.scaleOutEvents)
	}
	return res, nil
}

// scaleOutMember is one of a case's workers, with a runner and a pool of its own.
type scaleOutMember struct {
	owner  string
	pool   *pgxpool.Pool
	runner *projection.Runner
	wk     *worker.Worker
	stop   func() error
}

// catchUpWorkers starts c.workers workers of the projection at once, each with its own pool,
// runner and lease membership, and waits until they have committed every event (c.prefix of
// them, if set: then it stops the workers and checks the read model of what they committed).
func (r *scaleOutRun) catchUpWorkers(ctx context.Context, name string, c scaleOutCase) (scaleOutResult, error) {
	want := int64(r.h.sizes.scaleOutEvents)
	if c.prefix > 0 {
		want = int64(min(c.prefix, r.h.sizes.scaleOutEvents))
	}
	var handled atomic.Int64
	var members []*scaleOutMember
	defer func() {
		for _, m := range members {
			if m.stop != nil {
				_ = m.stop()
			}
			// The server's connections are few: a case's pools do not outlive it.
			m.pool.Close()
		}
	}()
	for i := range c.workers {
		m, err := r.newMember(ctx, name, c, &handled)
		if err != nil {
			return scaleOutResult{}, err
		}
		m.owner = fmt.Sprintf("bench-%s-w%d", name, i)
		members = append(members, m)
	}
	started := time.Now()
	if err := r.startMembers(ctx, members, c); err != nil {
		return scaleOutResult{}, err
	}
	var converged time.Duration
	timeout := 2*time.Minute + 2*time.Duration(want)*c.wait
	err := waitUntil(ctx, timeout, 5*time.Millisecond, "every event committed", func() (bool, error) {
		if converged == 0 && fairShares(members, name, c.partitions) {
			converged = time.Since(started)
		}
		return handled.Load() >= want, nil
	})
	res := scaleOutResult{took: time.Since(started), events: int(handled.Load()), converged: converged}
	if err != nil {
		return res, fmt.Errorf("%w (%d of %d events committed)", err, handled.Load(), want)
	}
	if c.prefix > 0 {
		return res, r.stopPrefix(ctx, name, members, &handled)
	}
	// The batches' count says every event committed; the folded status must agree.
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err = members[0].runner.WaitCaughtUp(waitCtx, name)
	cancel()
	if err != nil {
		return res, err
	}
	var errs []error
	for _, m := range members {
		errs = append(errs, m.stop())
	}
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if res.events != int(want) {
		return res, fmt.Errorf("committed %d events, want %d", res.events, want)
	}
	return res, nil
}

// stopPrefix stops the members of a prefix case and checks that the read model holds the
// events they committed, the backlog's first ones (one worker of an unpartitioned projection
// commits them in order).
func (r *scaleOutRun) stopPrefix(ctx context.Context, name string, members []*scaleOutMember, handled *atomic.Int64) error {
	var errs []error
	for _, m := range members {
		errs = append(errs, m.stop())
		m.stop = nil
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return r.f.checkTickets(ctx, name, int(handled.Load()), scaleOutStreams)
}

// newMember makes a worker's runner for the case, on a pool of its own, and registers the
// projection. Its batches count into handled.
func (r *scaleOutRun) newMember(ctx context.Context, name string, c scaleOutCase, handled *atomic.Int64) (*scaleOutMember, error) {
	p, err := scaleOutProjection(name, c.partitions, c.wait)
	if err != nil {
		return nil, err
	}
	// The partitions this worker catches up at once, each a connection, and a few more.
	owned := (c.partitions + c.workers - 1) / c.workers
	if c.atOnce > 0 {
		owned = min(owned, c.atOnce)
	}
	pool, err := r.f.db.newPool(ctx, int32(owned+3))
	if err != nil {
		return nil, err
	}
	m := &scaleOutMember{pool: pool}
	if m.runner, err = newMemberRunner(pool, p, handled, r.h.libLog); err == nil {
		err = m.runner.Init(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return m, nil
}

// newMemberRunner returns a runner of p on its own backend over pool, whose batches count into
// handled.
func newMemberRunner(pool *pgxpool.Pool, p *projection.Projection, handled *atomic.Int64, log *slog.Logger) (*projection.Runner, error) {
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		return nil, err
	}
	backend, err := pgproj.New(store)
	if err != nil {
		return nil, err
	}
	return projection.NewRunner(backend, projection.RunnerConfig{Logger: log, OnBatch: func(b projection.BatchReport) {
		if b.Err == nil {
			handled.Add(int64(b.Events))
		}
	}}, p)
}

// fairShares reports whether every member owns its fair share of the projection's partitions
// (partitions / members, some one more) and together all of them.
func fairShares(members []*scaleOutMember, name string, partitions int) bool {
	fair := partitions / len(members)
	total := 0
	for _, m := range members {
		if m.wk == nil {
			return false
		}
		n := len(m.wk.Owned(name))
		if n < fair || n > fair+1 {
			return false
		}
		total += n
	}
	return total == partitions
}

// startMembers starts every member's worker at once and returns when all of them run.
func (r *scaleOutRun) startMembers(ctx context.Context, members []*scaleOutMember, c scaleOutCase) error {
	var (
		wg   sync.WaitGroup
		errs = make([]error, len(members))
	)
	for i, m := range members {
		wg.Go(func() {
			// The worker renews its leases on a pool of two connections it makes from this
			// one's settings, so renewals never wait behind the batches.
			cfg := worker.Config{SafetyNetInterval: -1, MaxConcurrentPartitions: c.atOnce,
				Leases: &worker.Leases{DB: m.pool, Owner: m.owner, TTL: scaleOutTTL, Renew: scaleOutRenew}}
			m.wk, m.stop, errs[i] = r.h.startWorker(ctx, r.f, r.w, m.runner, cfg)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// medianDuration returns the median of ds (the upper one of an even count).
func medianDuration(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}
