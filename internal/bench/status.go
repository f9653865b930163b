package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
)

// The status targets: what `nudge status` and a metrics scrape cost must not grow with the
// backlog (10 projections, each the whole store behind).
var (
	targetStatuses = Target{Name: "Backend.Statuses, 10 projections with a backlog (median)", Op: AtMost, Threshold: 50, Unit: "ms"}
	targetScrape   = Target{Name: "metrics scrape (WatchRunner + Gather), 10 projections with a backlog (median)", Op: AtMost, Threshold: 50, Unit: "ms"}
)

func statusTargets() []Target { return []Target{targetStatuses, targetScrape} }

// The status scenario's event types. The first four take turns by global position; refunds
// exist only in the last tenth of the store, as a type added late in a store's life would.
const (
	statusTypeRegistered = "TicketWasRegistered"
	statusTypePaid       = "TicketWasPaid"
	statusTypeCancelled  = "TicketWasCancelled"
	statusTypeSeat       = "SeatWasReserved"
	statusTypeRefunded   = "TicketWasRefunded"
)

// statusProjections are the types of the scenario's ten projections, status_00 to status_09;
// nil handles every type.
var statusProjections = [][]string{
	nil,
	{statusTypeRegistered},
	{statusTypePaid, statusTypeCancelled},
	nil,
	{statusTypeSeat},
	{statusTypeRegistered, statusTypeSeat},
	nil,
	{statusTypeCancelled},
	{statusTypeRefunded},
	nil,
}

const (
	// statusMinRuns is the fewest runs of each measurement; sizes.statusRuns the most, as far
	// as sizes.statusBudget allows.
	statusMinRuns = 3
	// statusScrapeTimeout is the metrics' QueryTimeout here: long enough that a slow status
	// query is measured rather than left out of the scrape, short enough to bound a scrape
	// (Gather takes no context: Ctrl-C waits for the scrape in flight).
	statusScrapeTimeout = 30 * time.Second
)

// statusTypesSQL installs, for the load only, a trigger that types each event by its global
// position (eventload writes one type): the four common types take turns, and the last tenth
// of the events has a refund every eighth event instead of a seat reservation.
func statusTypesSQL(events int) string {
	common := "ARRAY['" + strings.Join([]string{statusTypeRegistered, statusTypePaid, statusTypeCancelled, statusTypeSeat}, "','") + "']"
	return fmt.Sprintf(`CREATE FUNCTION bench_event_type() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			NEW.event_type := CASE WHEN NEW.global_position > %d AND NEW.global_position %% 8 = 7 THEN '%s'
				ELSE (%s)[1 + NEW.global_position %% 4] END;
			RETURN NEW;
		END $$;
		CREATE TRIGGER bench_event_type BEFORE INSERT ON nudge_events FOR EACH ROW EXECUTE FUNCTION bench_event_type()`,
		events-events/10, statusTypeRefunded, common)
}

// statusUntypeSQL removes statusTypesSQL's trigger.
const statusUntypeSQL = `DROP TRIGGER bench_event_type ON nudge_events; DROP FUNCTION bench_event_type()`

// exactLagSQL is the baseline: the exact lag count the library ran for every status before
// it estimated, over every type, or over the types in $1 when typed.
func exactLagSQL(horizon string, typed bool) string {
	q := `SELECT count(*) FROM nudge_events WHERE (transaction_id, global_position) > ('0'::xid8, 0) AND transaction_id < ` + horizon
	if typed {
		q += ` AND event_type = ANY($1::text[])`
	}
	return q
}

// lagReading is what one way of reading the status said of each projection.
type lagReading struct {
	lag       map[string]int64
	estimated map[string]bool // nil where the way does not say
	condition map[string]projection.Condition
}

// statusMeasure is one way of reading the status, timed over several runs.
type statusMeasure struct {
	label   string
	short   string // for notes
	read    func(ctx context.Context) (lagReading, error)
	samples []time.Duration
	last    lagReading
}

func runStatus(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["projections"] = sz.statusEvents, sz.rebuildStreams, len(statusProjections)
	sec.Params["max_runs"], sec.Params["min_runs"], sec.Params["budget_s"] = sz.statusRuns, statusMinRuns, sz.statusBudget.Seconds()
	table := &Table{Header: []string{"case", "median ms", "max ms", "runs", "baseline ms", "ratio", "lag status_00 (any)", "lag status_08 (late type)", "= exact", "estimated"}}
	sec.table = table

	f, err := h.newFixture(ctx, 4)
	if err != nil {
		return err
	}
	defer f.close()
	if err := loadTypedEvents(ctx, h, f, sz.statusEvents); err != nil {
		return err
	}
	ps, err := registerStatusProjections(ctx, f)
	if err != nil {
		return err
	}
	measures, err := h.statusMeasures(ctx, f, ps)
	if err != nil {
		return err
	}
	var warm int64 // one count of every event warms the caches
	if err := f.db.pool.QueryRow(ctx, exactLagSQL(f.store.HorizonSQL(), false)).Scan(&warm); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := runStatusRounds(ctx, h, measures); err != nil {
		return err
	}
	h.reportStatus(sec, table, measures)
	return checkStatusStart(measures, sz.statusEvents)
}

// checkStatusStart checks that the projections were measured where the scenario means them to
// be: registered at position zero, so a projection of every type lags by every event.
func checkStatusStart(measures []*statusMeasure, events int) error {
	for _, m := range measures {
		if len(m.last.lag) != len(statusProjections) {
			return fmt.Errorf("%s: the lag of %d projections, want %d", m.label, len(m.last.lag), len(statusProjections))
		}
	}
	if got := measures[0].last.lag["status_00"]; got != int64(events) {
		return fmt.Errorf("status_00 (every type) lags %d events, want all %d: its status row is not at position zero", got, events)
	}
	return nil
}

// loadTypedEvents loads events with the rebuild's loader, typed by statusTypesSQL's trigger,
// and waits until they are readable.
func loadTypedEvents(ctx context.Context, h *harness, f *fixture, events int) error {
	started := time.Now()
	if _, err := f.db.pool.Exec(ctx, statusTypesSQL(events)); err != nil {
		return fmt.Errorf("install the typing trigger: %w", err)
	}
	last, err := loadEvents(f.db.pool, events, h.sizes.rebuildStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if _, err := f.db.pool.Exec(ctx, statusUntypeSQL); err != nil {
		return fmt.Errorf("remove the typing trigger: %w", err)
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	h.log.InfoContext(ctx, "status: events loaded with COPY", slog.Int("events", events),
		slog.Duration("took", time.Since(started).Round(time.Millisecond)))
	return nil
}

// registerStatusProjections registers the scenario's projections through the backend, which
// creates their status rows at position zero (checkStatusStart checks it).
func registerStatusProjections(ctx context.Context, f *fixture) ([]*projection.Projection, error) {
	ps := make([]*projection.Projection, 0, len(statusProjections))
	for i, types := range statusProjections {
		name := fmt.Sprintf("status_%02d", i)
		var handlers []projection.Handler
		for _, t := range types {
			handlers = append(handlers, projection.OnIdempotent(t, func(context.Context, projection.Event[ticketRegistered]) error { return nil }))
		}
		if types == nil {
			handlers = append(handlers, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
		}
		p, err := projection.New(name, projection.Config{}, handlers...)
		if err != nil {
			return nil, err
		}
		if err := f.backend.Register(ctx, p, nil); err != nil { // no init hook
			return nil, fmt.Errorf("register %s: %w", name, err)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// statusMeasures returns the baseline (the exact counts), Backend.Statuses and a scrape of the
// metrics package's WatchRunner collector, in that order.
func (h *harness) statusMeasures(ctx context.Context, f *fixture, ps []*projection.Projection) ([]*statusMeasure, error) {
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog}, ps...)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	// No cache: every Gather queries. QueryTimeout: see statusScrapeTimeout.
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1, QueryTimeout: statusScrapeTimeout, Logger: h.libLog})
	if err != nil {
		return nil, err
	}
	if err := m.WatchRunner(runner); err != nil {
		return nil, err
	}
	all, typed := exactLagSQL(f.store.HorizonSQL(), false), exactLagSQL(f.store.HorizonSQL(), true)
	exact := func(ctx context.Context) (lagReading, error) {
		r := lagReading{lag: map[string]int64{}}
		for _, p := range ps {
			var n int64
			var err error
			if types := p.Types(); types == nil {
				err = f.db.pool.QueryRow(ctx, all).Scan(&n)
			} else {
				err = f.db.pool.QueryRow(ctx, typed, types).Scan(&n)
			}
			if err != nil {
				return r, fmt.Errorf("count the lag of %s: %w", p.Name(), err)
			}
			r.lag[p.Name()] = n
		}
		return r, nil
	}
	statuses := func(ctx context.Context) (lagReading, error) {
		sts, err := f.backend.Statuses(ctx)
		if err != nil {
			return lagReading{}, err
		}
		r := lagReading{lag: map[string]int64{}, estimated: map[string]bool{}, condition: map[string]projection.Condition{}}
		for _, st := range sts {
			r.lag[st.Name], r.estimated[st.Name], r.condition[st.Name] = st.LagEvents, st.LagEstimated, st.Condition()
		}
		return r, nil
	}
	scrape := func(context.Context) (lagReading, error) { return gatherLags(reg) }
	return []*statusMeasure{
		{label: "exact lag count in SQL, 10 projections (baseline)", short: "exact count", read: exact},
		{label: "Backend.Statuses, 10 projections", short: "Statuses", read: statuses},
		{label: "metrics scrape (WatchRunner, Gather), 10 projections", short: "scrape", read: scrape},
	}, nil
}

// gatherLags scrapes reg and returns the lag gauges; a failed status query is an error.
func gatherLags(reg *prometheus.Registry) (lagReading, error) {
	families, err := reg.Gather()
	if err != nil {
		return lagReading{}, err
	}
	r := lagReading{lag: map[string]int64{}}
	for _, fam := range families {
		switch fam.GetName() {
		case metrics.NamespaceDefault + "_projection_lag_events":
			for _, mt := range fam.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "projection" {
						r.lag[l.GetValue()] = int64(mt.GetGauge().GetValue())
					}
				}
			}
		case metrics.NamespaceDefault + "_metrics_collect_errors_total":
			for _, mt := range fam.GetMetric() {
				if v := mt.GetCounter().GetValue(); v > 0 {
					return r, fmt.Errorf("the scrape's status queries failed %.0f time(s) (see the log file)", v)
				}
			}
		}
	}
	if len(r.lag) != len(statusProjections) {
		return r, fmt.Errorf("the scrape has the lag of %d projections, want %d", len(r.lag), len(statusProjections))
	}
	return r, nil
}

// runStatusRounds runs every measure once per round, interleaved, so that a noisy moment
// spreads over all of them: at least statusMinRuns rounds, then more up to sizes.statusRuns
// while the budget lasts.
func runStatusRounds(ctx context.Context, h *harness, measures []*statusMeasure) error {
	started := time.Now()
	for round := range h.sizes.statusRuns {
		if round >= statusMinRuns && time.Since(started) > h.sizes.statusBudget {
			break
		}
		for _, m := range measures {
			if err := ctx.Err(); err != nil {
				return err
			}
			t0 := time.Now()
			r, err := m.read(ctx)
			took := time.Since(t0)
			if err != nil {
				return fmt.Errorf("%s: %w", m.label, err)
			}
			m.samples, m.last = append(m.samples, took), r
		}
		h.log.InfoContext(ctx, "status: round done", slog.Int("round", round+1),
			slog.Duration("elapsed", time.Since(started).Round(time.Millisecond)))
	}
	return nil
}

// reportStatus adds the measures' rows, metrics, checks and notes.
func (h *harness) reportStatus(sec *Section, table *Table, measures []*statusMeasure) {
	base := measures[0]
	exact := base.last.lag
	baseMedian := medianMs(base.samples)
	for i, m := range measures {
		med, mx := medianMs(m.samples), Ms(slices.Max(m.samples))
		match, estimated := lagAgreement(m.last, exact)
		metric := Metric{Case: m.label, Name: "median_ms", Unit: "ms", Value: med,
			Extra: map[string]float64{"max_ms": mx, "runs": float64(len(m.samples)), "lag_exact_projections": float64(match)}}
		for name, lag := range m.last.lag {
			metric.Extra["lag_"+name] = float64(lag)
		}
		baseline, ratio := "", ""
		if i > 0 {
			metric = metric.WithBaseline(base.label, baseMedian)
			baseline, ratio = FormatValue(baseMedian, "ms"), FormatValue(metric.Ratio, "×")
		}
		estCell := "—"
		if m.last.estimated != nil {
			metric.Extra["lag_estimated_projections"] = float64(estimated)
			estCell = fmt.Sprintf("%d/%d", estimated, len(statusProjections))
		}
		sec.AddMetric(metric)
		table.Add(m.label, FormatValue(med, "ms"), FormatValue(mx, "ms"), fmt.Sprint(len(m.samples)), baseline, ratio,
			FormatValue(float64(m.last.lag["status_00"]), ""), FormatValue(float64(m.last.lag["status_08"]), ""),
			fmt.Sprintf("%d/%d", match, len(statusProjections)), estCell)
	}
	events := Thousands(int64(h.sizes.statusEvents))
	sec.AddCheck(targetStatuses, fmt.Sprintf("10 projections each %s events behind, max %s ms", events,
		FormatValue(Ms(slices.Max(measures[1].samples)), "ms")), medianMs(measures[1].samples))
	sec.AddCheck(targetScrape, fmt.Sprintf("10 projections each %s events behind, max %s ms", events,
		FormatValue(Ms(slices.Max(measures[2].samples)), "ms")), medianMs(measures[2].samples))
	sec.Note("every projection's stored position is zero: each is the whole store (%s events, %s streams) behind, of its types; "+
		"types take turns by position, %s only in the last tenth", events, Thousands(int64(h.sizes.rebuildStreams)), statusTypeRefunded)
	sec.Note("ratio: median over the baseline's, the exact count the library ran before (one count(*) per projection, " +
		"horizon from store.HorizonSQL()); = exact: projections whose lag equals that count; estimated: Status.LagEstimated")
	sec.Note("scrape: a fresh prometheus.Registry, metrics.WatchRunner over a projection.Runner (one Runner.Status per projection), no cache, QueryTimeout %s",
		statusScrapeTimeout)
	if scrape := medianMs(measures[2].samples); scrape > Ms(metrics.QueryTimeoutDefault) {
		sec.Note("with the default QueryTimeout (%s), such a scrape (%s ms) would leave out the projections not reached in time",
			metrics.QueryTimeoutDefault, FormatValue(scrape, "ms"))
	}
	for _, m := range measures[1:] {
		for _, line := range lagDifferences(m, exact) {
			sec.Note("%s", line)
		}
	}
}

// lagAgreement counts the projections whose lag in r equals the exact one, and those r says
// it estimated.
func lagAgreement(r lagReading, exact map[string]int64) (match, estimated int) {
	for name, lag := range r.lag {
		if lag == exact[name] {
			match++
		}
		if r.estimated[name] {
			estimated++
		}
	}
	return match, estimated
}

// lagDifferences describes the projections whose lag in m is off the exact count by more than
// 1 %, the worst first; one reported caught up (0) while it is behind is always described.
func lagDifferences(m *statusMeasure, exact map[string]int64) []string {
	type diff struct {
		name     string
		got, was int64
		rel      float64
	}
	var diffs []diff
	for name, got := range m.last.lag {
		was := exact[name]
		rel := math.Abs(float64(got-was)) / math.Max(float64(was), 1)
		if rel > 0.01 || got == 0 && was > 0 {
			diffs = append(diffs, diff{name, got, was, rel})
		}
	}
	slices.SortFunc(diffs, func(a, b diff) int { return cmp.Compare(b.rel, a.rel) })
	lines := make([]string, 0, len(diffs))
	for _, d := range diffs {
		line := fmt.Sprintf("%s: %s (types %s) lags %s events, exact %s (%+.0f%%)", m.short, d.name,
			typesOf(d.name), Thousands(d.got), Thousands(d.was), 100*float64(d.got-d.was)/math.Max(float64(d.was), 1))
		if d.got == 0 && d.was > 0 {
			line += ": reported caught up while behind"
			if c, ok := m.last.condition[d.name]; ok {
				line += fmt.Sprintf(" (Condition %s)", c)
			}
		}
		lines = append(lines, line)
	}
	return lines
}

// typesOf lists the types of the projection called name.
func typesOf(name string) string {
	var i int
	if _, err := fmt.Sscanf(name, "status_%d", &i); err != nil || i < 0 || i >= len(statusProjections) {
		return "?"
	}
	if statusProjections[i] == nil {
		return "any"
	}
	return strings.Join(statusProjections[i], ",")
}

// medianMs is the median of samples in milliseconds (the upper middle one of an even count).
func medianMs(samples []time.Duration) float64 {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return Ms(s[len(s)/2])
}
