package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/projection"
)

const (
	// deepProjections are the projections whose status the deep scenario reads, their
	// positions spread over the log.
	deepProjections = 300
	// deepMinEvents is the smallest depth -deep-events takes.
	deepMinEvents = 1_000
	// deepProgressDeadline bounds a wait for the horizon (a transaction elsewhere in the
	// cluster): loaded events not readable, or a catch-up handling no event, for that long
	// fails the scenario, after a load that may have taken half an hour.
	deepProgressDeadline = 10 * time.Minute
	// mib is a megabyte in the scenario's sizes (pg_size_pretty's).
	mib = 1 << 20
	// deepExtrapolate is the store size the scenario's notes extrapolate the sizes to.
	deepExtrapolate = 500_000_000
)

// deepTypes are the type sets of the deep scenario's projections, in turn (nil: every type);
// the console scenario's.
var deepTypes = [][]string{nil, {statusTypeRegistered}, {statusTypePaid, statusTypeCancelled}, {statusTypeSeat}, {statusTypeRefunded}}

// deepEventType types event i of a store of events events as statusTypesSQL's trigger does by
// global position (i+1 in a fresh store): the four common types take turns, and the last tenth
// has a refund every eighth event.
func deepEventType(events int) func(i int) string {
	common := [4]string{statusTypeRegistered, statusTypePaid, statusTypeCancelled, statusTypeSeat}
	return func(i int) string {
		gp := i + 1
		if gp > events-events/10 && gp%8 == 7 {
			return statusTypeRefunded
		}
		return common[gp%4]
	}
}

// parseDepths reads -deep-events: comma-separated event counts; empty gives nil.
func parseDepths(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var depths []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(part), "_", ""))
		if err != nil || n < deepMinEvents {
			return nil, fmt.Errorf("-deep-events %q: give event counts of at least %d, comma-separated", s, deepMinEvents)
		}
		depths = append(depths, n)
	}
	return depths, nil
}

// deepSpread is the global position of each of n projections spread evenly over a fresh store
// of events events: the first an nth of the way, the last at the head.
func deepSpread(events, n int) []int64 {
	gps := make([]int64, n)
	for i := range gps {
		gps[i] = int64(i+1) * int64(events) / int64(n)
	}
	return gps
}

// deepResult is what the scenario measured at one depth.
type deepResult struct {
	events int
	// load is the COPY load's time (with the streams table and ANALYZE); vacuum VACUUM
	// (ANALYZE)'s after it, freeze a VACUUM (FREEZE)'s after that.
	load, vacuum, freeze time.Duration
	// Backend.Statuses over the 300 projections before and after the VACUUM: the first call,
	// then the others.
	coldFirst, warmFirst time.Duration
	cold, warm           []time.Duration
	// lagFirst is the lag Statuses gave the first projection (every type, an nth in).
	lagFirst int64

	size deepSizes

	catchUpEvents     int     // events of each catch-up
	fromZero, nearEnd float64 // events/s

	appends Latency
	live    deepLiveResult
}

// deepSizes are the events table's and its indexes' sizes after the VACUUM.
type deepSizes struct {
	table, total      int64 // pg_table_size (heap, TOAST, FSM, VM) and pg_total_relation_size
	pages, allVisible int64 // pg_class.relpages and relallvisible
	indexes           []indexSize
	levelsErr         string // why the btree levels are unknown, if they are
}

// indexSize is one index of the events table: its size and its btree's levels (root to leaf;
// 0 when unknown).
type indexSize struct {
	name   string
	bytes  int64
	levels int
}

// deepLiveResult is the live projection at the head during the appends' window.
type deepLiveResult struct {
	window             time.Duration // the appends' time
	drained            time.Duration // from the first append until the projection handled the last
	appended           int64
	lagAtEnd           int64 // appended but not handled when the appends stopped
	appends, staleness Latency
}

func runDeep(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["depths"], sec.Params["streams"], sec.Params["projections"] = sz.deepEvents, sz.rebuildStreams, deepProjections
	sec.Params["catch_up_events"], sec.Params["batch_size"] = sz.deepCatchUp, projection.BatchSizeDefault
	sec.Params["appends"], sec.Params["warm_appends"], sec.Params["live_s"] = sz.deepAppends, sz.deepWarmAppends, sz.deepLive.Seconds()
	sec.Params["payload_bytes"] = len(ticketPayload(eventloadStream(0), 0))
	// Every depth is loaded first and kept; then each measurement runs at every depth in
	// turn, so that a depth's figure and the first depth's are taken moments apart on a
	// machine whose load moves.
	depths := make([]*deepDepth, 0, len(sz.deepEvents))
	defer func() {
		for _, d := range depths {
			d.f.close()
		}
	}()
	err := func() error {
		for _, n := range sz.deepEvents {
			f, err := h.newFixture(ctx, 8)
			if err != nil {
				return err
			}
			d := &deepDepth{r: &deepResult{events: n}, f: f}
			depths = append(depths, d)
			if err := h.deepSteps(ctx, d, d.r.setupSteps()); err != nil {
				return err
			}
		}
		for i := range depths[0].r.measureSteps() {
			for _, d := range depths {
				if err := h.deepSteps(ctx, d, d.r.measureSteps()[i:i+1]); err != nil {
					return err
				}
			}
		}
		return nil
	}()
	results := make([]*deepResult, 0, len(depths))
	for _, d := range depths {
		if d.done {
			results = append(results, d.r)
		}
	}
	if len(results) > 0 {
		reportDeep(sec, results)
	}
	return err
}

// deepDepth is one depth's store and results; done once every step has run.
type deepDepth struct {
	r    *deepResult
	f    *fixture
	done bool
}

// deepStep is one step of the scenario at one depth.
type deepStep struct {
	name string
	run  func(context.Context, *harness, *fixture) error
}

// setupSteps load the store and measure what only a freshly loaded store shows: the status
// before VACUUM, the VACUUM's time, the sizes it leaves.
func (r *deepResult) setupSteps() []deepStep {
	return []deepStep{
		{"load", r.loadStore},
		{"status before VACUUM", func(ctx context.Context, h *harness, f *fixture) (err error) {
			r.coldFirst, r.cold, err = r.timeStatuses(ctx, h, f)
			return err
		}},
		{"vacuum", r.vacuumStore},
		{"sizes", r.measureSizes},
	}
}

// measureSteps are the measurements of a vacuumed store, run at every depth in turn; the
// last one marks the depth done.
func (r *deepResult) measureSteps() []deepStep {
	return []deepStep{
		{"status after VACUUM", func(ctx context.Context, h *harness, f *fixture) (err error) {
			r.warmFirst, r.warm, err = r.timeStatuses(ctx, h, f)
			return err
		}},
		{"catch-ups", r.catchUps},
		{"appends", func(ctx context.Context, h *harness, f *fixture) (err error) {
			r.appends, _, err = deepAppend(ctx, h, f, h.sizes.deepWarmAppends+h.sizes.deepAppends, h.sizes.deepWarmAppends, 0, nil)
			return err
		}},
		{"live at the head", r.liveAtHead},
	}
}

// deepSteps runs steps at depth d; after the last measurement step, d is done.
func (h *harness) deepSteps(ctx context.Context, d *deepDepth, steps []deepStep) error {
	for _, s := range steps {
		started := time.Now()
		if err := s.run(ctx, h, d.f); err != nil {
			return fmt.Errorf("%s events: %s: %w", Thousands(int64(d.r.events)), s.name, err)
		}
		h.log.InfoContext(ctx, "deep: step done", slog.Int("events", d.r.events), slog.String("step", s.name),
			slog.Duration("took", time.Since(started).Round(time.Millisecond)))
		d.done = d.done || s.name == "live at the head"
	}
	return nil
}

// loadStore COPY-loads the events with autovacuum off on the events table, so that the first
// status reads see the store as the load left it (no page all-visible) and the VACUUM after
// it does the whole table's work; then registers the 300 projections at their positions.
func (r *deepResult) loadStore(ctx context.Context, h *harness, f *fixture) error {
	if _, err := f.db.pool.Exec(ctx, `ALTER TABLE nudge_events SET (autovacuum_enabled = off)`); err != nil {
		return err
	}
	started := time.Now()
	last, err := loadEventsOfTypes(f.db.pool, r.events, h.sizes.rebuildStreams, deepEventType(r.events), ticketPayload)
	if err == nil {
		err = f.waitReadable(ctx, last, deepProgressDeadline)
	}
	r.load = time.Since(started)
	if err != nil {
		return err
	}
	if last.GlobalPosition != int64(r.events) {
		return fmt.Errorf("the last loaded event is at global position %d, want %d: the store was not empty", last.GlobalPosition, r.events)
	}
	names := make([]string, deepProjections)
	for i := range names {
		names[i] = fmt.Sprintf("deep_%03d", i)
		if err := f.registerAt(ctx, deepProjection(names[i], deepTypes[i%len(deepTypes)]), 0); err != nil {
			return err
		}
	}
	return f.placeAt(ctx, names, deepSpread(r.events, deepProjections))
}

// deepProjection is a projection of types (nil: every type) whose handler does nothing: its
// catch-up costs the store's reads and the batches' transactions.
func deepProjection(name string, types []string) *projection.Projection {
	var handlers []projection.Handler
	for _, t := range types {
		handlers = append(handlers, projection.OnIdempotent(t, func(context.Context, projection.Event[ticketRegistered]) error { return nil }))
	}
	if len(handlers) == 0 {
		handlers = append(handlers, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	}
	p, err := projection.New(name, projection.Config{}, handlers...)
	if err != nil {
		panic(err) // the names and handlers are the scenario's own
	}
	return p
}

// registerAt registers p and, if gp is not 0, moves its position to the event at global
// position gp.
func (f *fixture) registerAt(ctx context.Context, p *projection.Projection, gp int64) error {
	if err := f.backend.Register(ctx, p, nil); err != nil {
		return fmt.Errorf("register %s: %w", p.Name(), err)
	}
	if gp == 0 {
		return nil
	}
	return f.placeAt(ctx, []string{p.Name()}, []int64{gp})
}

// placeAt moves the position of each projection of names to the event at the global position
// of the same index in gps.
func (f *fixture) placeAt(ctx context.Context, names []string, gps []int64) error {
	tag, err := f.db.pool.Exec(ctx, `UPDATE nudge_projections p SET transaction_id = e.transaction_id, global_position = e.global_position
		FROM unnest($1::text[], $2::bigint[]) x(name, gp) JOIN nudge_events e ON e.global_position = x.gp
		WHERE p.name = x.name`, names, gps)
	if err != nil {
		return fmt.Errorf("place the projections: %w", err)
	}
	if tag.RowsAffected() != int64(len(names)) {
		return fmt.Errorf("placed %d projections, want %d", tag.RowsAffected(), len(names))
	}
	return nil
}

// timeStatuses times Backend.Statuses over the store's projections: a first call, then up to
// statusRuns more while the status budget lasts (at least statusMinRuns). Every call must give
// the first projection (every type, an nth of the way in) its lag within 1 %.
func (r *deepResult) timeStatuses(ctx context.Context, h *harness, f *fixture) (first time.Duration, samples []time.Duration, err error) {
	want := int64(r.events) - deepSpread(r.events, deepProjections)[0]
	started := time.Now()
	for round := range h.sizes.statusRuns + 1 {
		if round > statusMinRuns && time.Since(started) > h.sizes.statusBudget {
			break
		}
		t0 := time.Now()
		sts, err := f.backend.Statuses(ctx)
		took := time.Since(t0)
		if err != nil {
			return 0, nil, err
		}
		if len(sts) != deepProjections || sts[0].Name != "deep_000" {
			return 0, nil, fmt.Errorf("the statuses gave %d projections, want deep_000 to deep_%03d", len(sts), deepProjections-1)
		}
		r.lagFirst = sts[0].LagEvents
		if math.Abs(float64(r.lagFirst-want)) > float64(want)/100 {
			return 0, nil, fmt.Errorf("the statuses: deep_000 lags %d events, want %d (within 1%%)", r.lagFirst, want)
		}
		if round == 0 {
			first = took
		} else {
			samples = append(samples, took)
		}
	}
	return first, samples, nil
}

// vacuumStore runs the VACUUM autovacuum would have run after the load, then a VACUUM
// (FREEZE) (the work of an anti-wraparound vacuum), timing each, and turns autovacuum back on.
func (r *deepResult) vacuumStore(ctx context.Context, _ *harness, f *fixture) error {
	started := time.Now()
	if _, err := f.db.pool.Exec(ctx, `VACUUM (ANALYZE) nudge_events, nudge_streams`); err != nil {
		return err
	}
	r.vacuum = time.Since(started)
	started = time.Now()
	if _, err := f.db.pool.Exec(ctx, `VACUUM (FREEZE) nudge_events`); err != nil {
		return err
	}
	r.freeze = time.Since(started)
	_, err := f.db.pool.Exec(ctx, `ALTER TABLE nudge_events RESET (autovacuum_enabled)`)
	return err
}

// measureSizes reads the events table's and its indexes' sizes, its all-visible pages and,
// through pageinspect where the server has it, each btree's levels.
func (r *deepResult) measureSizes(ctx context.Context, _ *harness, f *fixture) error {
	s := &r.size
	err := f.db.pool.QueryRow(ctx, `SELECT pg_table_size(c.oid), pg_total_relation_size(c.oid), c.relpages, c.relallvisible
		FROM pg_class c WHERE c.oid = 'nudge_events'::regclass`).Scan(&s.table, &s.total, &s.pages, &s.allVisible)
	if err != nil {
		return err
	}
	rows, err := f.db.pool.Query(ctx, `SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'nudge_events'::regclass ORDER BY c.relname`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var ix indexSize
		if err := rows.Scan(&ix.name, &ix.bytes); err != nil {
			rows.Close()
			return err
		}
		s.indexes = append(s.indexes, ix)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := f.db.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pageinspect`); err != nil {
		s.levelsErr = err.Error()
		return nil
	}
	for i := range s.indexes {
		var level int
		if err := f.db.pool.QueryRow(ctx, `SELECT level FROM bt_metap($1)`, s.indexes[i].name).Scan(&level); err != nil {
			return fmt.Errorf("btree levels of %s: %w", s.indexes[i].name, err)
		}
		s.indexes[i].levels = level + 1 // the root's level counts from 0 at the leaves
	}
	return nil
}

// catchUps times a projection of every type from zero over the first catchUpEvents events,
// and from catchUpEvents before the end to the head.
func (r *deepResult) catchUps(ctx context.Context, h *harness, f *fixture) error {
	r.catchUpEvents = min(h.sizes.deepCatchUp, r.events/4)
	zero, end := deepProjection("deep_zero", nil), deepProjection("deep_end", nil)
	if err := f.registerAt(ctx, zero, 0); err != nil {
		return err
	}
	if err := f.registerAt(ctx, end, int64(r.events-r.catchUpEvents)); err != nil {
		return err
	}
	counts := map[string]*atomic.Int64{zero.Name(): {}, end.Name(): {}}
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog, OnBatch: func(b projection.BatchReport) {
		if c := counts[b.Projection]; c != nil && b.Err == nil {
			c.Add(int64(b.Events))
		}
	}}, zero, end)
	if err != nil {
		return err
	}
	if r.fromZero, err = timedCatchUp(ctx, runner, zero.Name(), counts[zero.Name()], r.catchUpEvents, true); err != nil {
		return fmt.Errorf("from zero: %w", err)
	}
	if r.nearEnd, err = timedCatchUp(ctx, runner, end.Name(), counts[end.Name()], r.catchUpEvents, false); err != nil {
		return fmt.Errorf("near the end: %w", err)
	}
	return nil
}

// timedCatchUp catches name up until it has handled want events (counted by handled) and
// returns its events/s: several catch-ups if a transaction elsewhere in the cluster holds the
// horizon back a moment. With stop, it stops there (before the next batch); without, it
// reads to the head, where it must find exactly want events.
func timedCatchUp(ctx context.Context, runner *projection.Runner, name string, handled *atomic.Int64, want int, stop bool) (float64, error) {
	guard := projection.WithBatchGuard(func() (func(), bool) { return func() {}, !stop || handled.Load() < int64(want) })
	started, progressed := time.Now(), time.Now()
	for handled.Load() < int64(want) {
		before := handled.Load()
		if _, err := runner.CatchUp(ctx, name, guard); err != nil {
			return 0, err
		}
		if handled.Load() > before {
			progressed = time.Now()
			continue
		}
		if time.Since(progressed) > deepProgressDeadline {
			return 0, fmt.Errorf("no event handled for %s at %d of %d events: a long transaction elsewhere in the cluster holds the horizon", deepProgressDeadline, before, want)
		}
		if err := backoff.Sleep(ctx, 10*time.Millisecond); err != nil {
			return 0, err
		}
	}
	took := time.Since(started)
	got := handled.Load()
	if !stop && got != int64(want) {
		return 0, fmt.Errorf("read %d events to the head, want %d", got, want)
	}
	return Rate(int(got), took), nil
}

// deepAppend appends n events one per transaction, from one writer, to the loaded streams in
// turn, timing all but the first warm; it stops early when window passes (if not 0). After
// each append it wakes wake (if not nil) without blocking. It returns the timed appends and
// how many appends it made.
func deepAppend(ctx context.Context, h *harness, f *fixture, n, warm int, window time.Duration, wake chan<- struct{}) (Latency, int, error) {
	samples := make([]time.Duration, 0, min(max(n-warm, 0), 10_000))
	started := time.Now()
	i := 0
	for ; i < n && (window == 0 || time.Since(started) < window); i++ {
		stream := eventloadStream(i * 97 % h.sizes.rebuildStreams)
		ev := eventstore.EventData{Type: statusTypeRegistered, Payload: []byte(ticketPayload(stream, i))}
		t0 := time.Now()
		if _, err := f.store.Append(ctx, stream, eventstore.Any, ev); err != nil {
			return Latency{}, i, err
		}
		if i >= warm {
			samples = append(samples, time.Since(t0))
		}
		if wake != nil {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
	return Summarize(samples), i, nil
}

// liveAtHead appends for the live window, one event a transaction, while a projection placed
// at the head catches up after each append (woken as a trigger would wake it); then waits
// until it has handled every append.
func (r *deepResult) liveAtHead(ctx context.Context, h *harness, f *fixture) error {
	// The newest event, committed by the earlier steps' one writer: Store.Head is bounded by
	// the read horizon, which a transaction of another database in its commit window can hold
	// below the newest events for a moment, and a projection placed there would count them too.
	var head int64
	if err := f.db.pool.QueryRow(ctx, `SELECT coalesce(max(global_position), 0) FROM nudge_events`).Scan(&head); err != nil {
		return err
	}
	p := deepProjection("deep_live", nil)
	if err := f.registerAt(ctx, p, head); err != nil {
		return err
	}
	var (
		handled atomic.Int64
		mu      sync.Mutex
		stale   []time.Duration
	)
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog, OnBatch: func(b projection.BatchReport) {
		if b.Err == nil {
			handled.Add(int64(b.Events))
			mu.Lock()
			stale = append(stale, b.Staleness...)
			mu.Unlock()
		}
	}}, p)
	if err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	liveCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- wakeCatchUps(liveCtx, runner, p.Name(), wake) }()

	started := time.Now()
	appends, n, err := deepAppend(ctx, h, f, math.MaxInt, 0, h.sizes.deepLive, wake)
	r.live.window = time.Since(started)
	r.live.appended, r.live.appends = int64(n), appends
	r.live.lagAtEnd = r.live.appended - handled.Load()
	if err == nil {
		err = waitUntil(ctx, deepProgressDeadline, time.Millisecond, "the live projection handled every append", func() (bool, error) {
			select {
			case wake <- struct{}{}:
			default:
			}
			return handled.Load() >= r.live.appended, nil
		})
		r.live.drained = time.Since(started)
	}
	stop()
	if runErr := <-done; err == nil {
		err = runErr
	}
	mu.Lock()
	r.live.staleness = Summarize(stale)
	mu.Unlock()
	if err == nil && handled.Load() != r.live.appended {
		err = fmt.Errorf("the live projection handled %d events, want the %d appended", handled.Load(), r.live.appended)
	}
	return err
}

// wakeCatchUps catches name up each time wake fires, until ctx ends.
func wakeCatchUps(ctx context.Context, runner *projection.Runner, name string, wake <-chan struct{}) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
		if _, err := runner.CatchUp(ctx, name); err != nil {
			if ctx.Err() != nil {
				return nil // stopped in a batch, which rolled back
			}
			return err
		}
	}
}

// deepRow is one figure of the scenario at every depth.
type deepRow struct {
	label, name, unit string
	values            []float64 // by depth
}

// deepRows lays the results out as rows of figures, one value per depth.
func deepRows(rs []*deepResult) []deepRow {
	var rows []deepRow
	add := func(label, name, unit string, value func(r *deepResult) float64) {
		row := deepRow{label: label, name: name, unit: unit}
		for _, r := range rs {
			row.values = append(row.values, value(r))
		}
		rows = append(rows, row)
	}
	add("COPY load (with the streams table and ANALYZE)", "seconds", "s", func(r *deepResult) float64 { return r.load.Seconds() })
	add("COPY load (with the streams table and ANALYZE)", "events_per_s", "events/s", func(r *deepResult) float64 { return Rate(r.events, r.load) })
	add("VACUUM (ANALYZE) after the load", "seconds", "s", func(r *deepResult) float64 { return r.vacuum.Seconds() })
	add("VACUUM (FREEZE) after it", "seconds", "s", func(r *deepResult) float64 { return r.freeze.Seconds() })
	add("Backend.Statuses, 300 projections, before VACUUM", "first_call_ms", "ms", func(r *deepResult) float64 { return Ms(r.coldFirst) })
	add("Backend.Statuses, 300 projections, before VACUUM", "median_ms", "ms", func(r *deepResult) float64 { return medianMs(r.cold) })
	add("Backend.Statuses, 300 projections, after VACUUM", "first_call_ms", "ms", func(r *deepResult) float64 { return Ms(r.warmFirst) })
	add("Backend.Statuses, 300 projections, after VACUUM", "median_ms", "ms", func(r *deepResult) float64 { return medianMs(r.warm) })
	add("catch-up from zero, the first events", "events_per_s", "events/s", func(r *deepResult) float64 { return r.fromZero })
	add("catch-up near the end, the last events to the head", "events_per_s", "events/s", func(r *deepResult) float64 { return r.nearEnd })
	add("append, 1 event/tx, one writer", "p50_ms", "ms", func(r *deepResult) float64 { return Ms(r.appends.P50) })
	add("append, 1 event/tx, one writer", "p99_ms", "ms", func(r *deepResult) float64 { return Ms(r.appends.P99) })
	add("live at the head: appends (1 event/tx, one writer)", "events_per_s", "events/s", func(r *deepResult) float64 { return Rate(int(r.live.appended), r.live.window) })
	add("live at the head: appends (1 event/tx, one writer)", "p99_ms", "ms", func(r *deepResult) float64 { return Ms(r.live.appends.P99) })
	add("live at the head: handled (first append to the last handled)", "events_per_s", "events/s", func(r *deepResult) float64 { return Rate(int(r.live.appended), r.live.drained) })
	add("live at the head: lag when the appends stopped", "events", "events", func(r *deepResult) float64 { return float64(r.live.lagAtEnd) })
	add("live at the head: staleness (append to batch commit)", "p50_ms", "ms", func(r *deepResult) float64 { return Ms(r.live.staleness.P50) })
	add("live at the head: staleness (append to batch commit)", "p99_ms", "ms", func(r *deepResult) float64 { return Ms(r.live.staleness.P99) })
	add("nudge_events table (heap, TOAST, FSM, VM)", "MB", "MB", func(r *deepResult) float64 { return float64(r.size.table) / mib })
	add("nudge_events table (heap, TOAST, FSM, VM)", "bytes_per_event", "bytes/event", func(r *deepResult) float64 { return perEvent(r.size.table, r.events) })
	for i, ix := range rs[0].size.indexes {
		at := func(r *deepResult) indexSize {
			if i < len(r.size.indexes) {
				return r.size.indexes[i]
			}
			return indexSize{}
		}
		add("index "+ix.name, "MB", "MB", func(r *deepResult) float64 { return float64(at(r).bytes) / mib })
		add("index "+ix.name, "bytes_per_event", "bytes/event", func(r *deepResult) float64 { return perEvent(at(r).bytes, r.events) })
		add("index "+ix.name, "btree_levels", "levels", func(r *deepResult) float64 { return float64(at(r).levels) })
	}
	add("nudge_events with its indexes", "MB", "MB", func(r *deepResult) float64 { return float64(r.size.total) / mib })
	add("nudge_events with its indexes", "bytes_per_event", "bytes/event", func(r *deepResult) float64 { return perEvent(r.size.total, r.events) })
	add("all-visible pages after VACUUM", "share", "%", func(r *deepResult) float64 { return 100 * Ratio(float64(r.size.allVisible), float64(r.size.pages)) })
	return rows
}

func perEvent(bytes int64, events int) float64 { return Ratio(float64(bytes), float64(events)) }

// depthCase names a row's case at a depth.
func depthCase(label string, events int) string {
	return fmt.Sprintf("%s, %s events", label, Thousands(int64(events)))
}

// reportDeep adds the rows as metrics (each depth beside the first), the terminal table and
// the notes.
func reportDeep(sec *Section, rs []*deepResult) {
	header := []string{"figure", "unit"}
	for _, r := range rs {
		header = append(header, Thousands(int64(r.events))+" events")
	}
	if len(rs) > 1 {
		header = append(header, "ratio last/first")
	}
	table := &Table{Header: header}
	sec.table = table
	for _, row := range deepRows(rs) {
		cells := []string{row.label + " (" + row.name + ")", row.unit}
		for i, v := range row.values {
			m := Metric{Case: depthCase(row.label, rs[i].events), Name: row.name, Unit: row.unit, Value: v}
			if i > 0 {
				m = m.WithBaseline(depthCase(row.label, rs[0].events), row.values[0])
			}
			sec.AddMetric(m)
			cells = append(cells, FormatValue(v, row.unit))
		}
		if len(rs) > 1 {
			cells = append(cells, FormatValue(Ratio(row.values[len(rs)-1], row.values[0]), "×"))
		}
		table.Add(cells...)
	}
	deepNotes(sec, rs)
}

// deepNotes says how each figure was measured and extrapolates the sizes.
func deepNotes(sec *Section, rs []*deepResult) {
	var catchUps []string
	for _, r := range rs {
		catchUps = append(catchUps, fmt.Sprintf("%s at %s", Thousands(int64(r.catchUpEvents)), Thousands(int64(r.events))))
	}
	sec.Note("each depth: a fresh database, the events COPY-loaded (%d bytes of JSON payload, over the streams in turn, 5 types as the status scenario's) with autovacuum off on the table, dropped at the end; MB = 2^20 bytes",
		len(ticketPayload(eventloadStream(0), 0)))
	sec.Note("Backend.Statuses (what `nudge status` reads): 300 projections of 5 type sets, placed every 1/300 of the log, the last at the head; first call, then the median of the others; before VACUUM no page is all-visible and no hint bit set")
	sec.Note("catch-ups: a projection of every type with a handler that does nothing (the store's reads and the batch transactions), default batch size; from zero over the first events, and from that many before the end to the head (events: %s)",
		strings.Join(catchUps, ", "))
	sec.Note("appends: Store.Append of one event to an existing stream per transaction, one writer; live at the head: the same appends for the window while a projection placed at the head catches up after each (woken as a trigger would); staleness from BatchReport.Staleness")
	last := rs[len(rs)-1]
	if last.size.levelsErr != "" {
		sec.Note("btree levels unknown: pageinspect: %s", last.size.levelsErr)
	}
	var b strings.Builder
	for _, ix := range last.size.indexes {
		fmt.Fprintf(&b, ", %s %.0f GB", ix.name, perEvent(ix.bytes, last.events)*deepExtrapolate/1e9)
	}
	sec.Note("estimate, %s events at the %s events' bytes per event: table %.0f GB%s; with the indexes %.0f GB (before WAL, backups and free space)",
		Thousands(deepExtrapolate), Thousands(int64(last.events)), perEvent(last.size.table, last.events)*deepExtrapolate/1e9, b.String(),
		perEvent(last.size.total, last.events)*deepExtrapolate/1e9)
	if slices.ContainsFunc(rs, func(r *deepResult) bool { return r.live.lagAtEnd > max(10, r.live.appended/100) }) {
		sec.Note("live lag when the appends stopped above 10 events and 1 %% of the appends at some depth: the projection fell behind its single writer there")
	}
}
