// Package metrics exposes nudge's projections, workers and dead letters as Prometheus metrics,
// on a prometheus.Registerer of the caller's: nothing is registered on the global default
// registry unless it is the one passed.
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.New(metrics.Config{Registerer: reg})
//	runner, err := projection.NewRunner(backend, projection.RunnerConfig{OnBatch: m.ObserveBatch, OnCatchUp: m.ObserveCatchUp}, list)
//	err = m.WatchRunner(runner)                      // lag, state, horizon: read at scrape time
//	err = m.WatchWorker(w, runner.Names()...)        // the worker's trigger counters
//	err = m.WatchDeadLetters(dead, runner.Names()...) // failed dead letters per projection
//	err = m.AddRouterMetrics(router)                 // Watermill's router metrics, same registry
//	// or, with worker.Run's own router: worker.Config{RouterFunc: m.AddRouterMetrics, …}
//	// trigger transit: worker.Config{TriggerFunc: m.ObserveTrigger, …}
//	// relay delay: relay.Config{BatchFunc: m.ObserveRelay, …}
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Metrics
//
// Names below use the default namespace "nudge" (Config.Namespace). Every metric about a
// projection has the label projection.
//
// The list of every metric with its type, labels and help is docs/reference/metrics.md in
// the repository, generated from these collectors (make docs), so it cannot drift from them.
// The batch metrics (nudge_projection_events_projected_total, _batches_total,
// _batch_duration_seconds, _handler_failures_total, _build_paced_seconds_total) come with New
// and ObserveBatch/ObserveCatchUp; lag, state, condition, horizon, parked streams and version
// (nudge_projection_*) with WatchRunner; the trigger counters and partitions
// (nudge_worker_*) with WatchWorker; nudge_dead_letters_failed with WatchDeadLetters; the
// nudge_metrics_collect_* pair with each scrape-time query (label source); Watermill's
// nudge_router_* with AddRouterMetrics.
//
// outcome is committed (the batch committed events), failed (a handler failed on an event:
// projection.ErrHandler) or error (the batch could not run: the database is down, say).
// event_type is the type of the event a handler failed on. The batch counters and the
// histogram count this process's batches; the lag, state and dead-letter gauges are read from
// the database and are the same in every process.
//
// # Staleness
//
// nudge_projection_event_staleness_seconds is what an SLO on freshness is set on ("99% of
// events are in the read model within 1 s"): for every event a batch committed, the time from
// the event's recorded_at (the database's statement_timestamp() of the append's INSERT) to
// the batch's commit (clock_timestamp() read in the commit's round trip). Both ends are read
// from the database's clock, so no host's clock skews it; it bounds the time from the event's
// commit from above by what the append transaction did after its insert (for Append, one
// round trip). It includes the relay's or trigger's transit, the wait for the lock
// (nudge_projection_batch_lock_wait_seconds, a part of it) and the batch's own run. The
// trigger's trip from its publisher to the projection's handler is
// nudge_projection_trigger_transit_seconds (hosts' clocks: skew between hosts adds to it). The
// relay's part, from an event's recording to the commit of the relay's position after it
// published the event's trigger, is nudge_relay_delay_seconds (label relay; database clock;
// none with triggers in the append's transaction). The history a rebuild or a building
// version replays is left out: its age is not staleness.
//
//	histogram_quantile(0.99, sum by (projection, le) (rate(nudge_projection_event_staleness_seconds_bucket[5m])))
//
// # Scrape-time queries
//
// The gauges of WatchRunner and WatchDeadLetters are read when Prometheus scrapes, one query
// per projection (Runner.Status) and a listing of the failed dead letters. Each query has
// Config.QueryTimeout, so a slow database never holds a scrape for long; concurrent scrapes
// share one query, and a result is reused for Config.CacheTTL. A query that fails or times out
// leaves its gauges out of that scrape (no stale or made-up values), counts in
// nudge_metrics_collect_errors_total and is logged; the rest of the scrape goes on. Alert on
// that counter as well as on the gauges.
//
// The status query counts at most 1,000 events of a projection's backlog and estimates the
// rest (projection.Status.LagEstimated), so its cost does not grow with the backlog: a scrape
// of 10 projections each 100,000 events behind took 40 ms (median, `make bench -scenario
// status`, 2 shared cores under load; the exact count it replaced took 2.6 s there, and 4.2 s
// at 1,000,000 behind). Listing 10,000 failed dead letters takes 0.13–0.24 s.
//
// # Watermill's router metrics
//
// AddRouterMetrics adds Watermill's components/metrics to a router. Its handler histogram
// counts a dead-lettered trigger as a success (the dead-letter step acks it); count dead
// letters with nudge_worker_triggers_dead_lettered_total instead. Retries wait inside the
// handler, so its execution time includes the backoff.
package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// Defaults for Config.
const (
	// NamespaceDefault prefixes every metric name.
	NamespaceDefault = "nudge"
	// QueryTimeoutDefault bounds each scrape-time query.
	QueryTimeoutDefault = 2 * time.Second
	// CacheTTLDefault is how long a scrape-time query's result is reused.
	CacheTTLDefault = time.Second
)

// BatchDurationBucketsDefault returns the batch-duration histogram's default buckets, in seconds: 1 ms to
// 10 s (a batch is bounded by projection.Config.MaxBatchDuration).
func BatchDurationBucketsDefault() []float64 {
	return []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
}

// StalenessBucketsDefault returns the staleness histogram's default buckets, in seconds:
// exponential, doubling from 1 ms to 262 s (19 buckets), so a quantile read from it is within a
// factor of two, and an SLO threshold such as 1 s has a bucket boundary near it (1.024 s).
func StalenessBucketsDefault() []float64 {
	return prometheus.ExponentialBuckets(0.001, 2, 19)
}

// Batch outcomes, the values of the outcome label of nudge_projection_batches_total.
const (
	// OutcomeCommitted: the batch committed events.
	OutcomeCommitted = "committed"
	// OutcomeFailed: a handler failed on an event (projection.ErrHandler); the batch rolled back.
	OutcomeFailed = "failed"
	// OutcomeError: the batch could not run (an infrastructure error); it rolled back.
	OutcomeError = "error"
)

// Outcomes lists every batch outcome.
func Outcomes() []string { return []string{OutcomeCommitted, OutcomeFailed, OutcomeError} }

var (
	// ErrInvalidConfig reports a Config or argument that cannot work: no Registerer, a namespace
	// that is not a Prometheus name, no projection names, …
	ErrInvalidConfig = errors.New("metrics: invalid configuration")

	// ErrAlreadyRegistered reports collectors that are already registered: New twice with one
	// Registerer and namespace, a second WatchRunner on one Metrics, AddRouterMetrics twice on
	// one router. When the Registerer refused them, the error also wraps its
	// prometheus.AlreadyRegisteredError.
	ErrAlreadyRegistered = errors.New("metrics: already registered")
)

// Config configures Metrics.
type Config struct {
	// Registerer receives every collector. Required: pass prometheus.DefaultRegisterer to use
	// the global registry. Wrap it (prometheus.WrapRegistererWith) to add constant labels.
	Registerer prometheus.Registerer
	// Namespace prefixes every metric name; letters, digits and _. Defaults to NamespaceDefault.
	Namespace string
	// BatchDurationBuckets are the batch-duration histogram's buckets, in seconds. Defaults to
	// BatchDurationBucketsDefault().
	BatchDurationBuckets []float64
	// StalenessBuckets are the event-staleness histogram's buckets, in seconds. Defaults to
	// StalenessBucketsDefault().
	StalenessBuckets []float64
	// QueryTimeout bounds each scrape-time query (statuses, dead letters). Defaults to
	// QueryTimeoutDefault. Keep it below Prometheus's scrape_timeout.
	QueryTimeout time.Duration
	// CacheTTL is how long a scrape-time query's result is reused by later scrapes. Defaults to
	// CacheTTLDefault; a negative value queries at every scrape.
	CacheTTL time.Duration
	// Logger receives a warning for each scrape-time query that fails. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// increasing reports whether buckets increase strictly.
func increasing(buckets []float64) bool {
	return slices.IsSorted(buckets) && len(slices.Compact(slices.Clone(buckets))) == len(buckets)
}

var namespaceRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Metrics records and exposes nudge's metrics. Create it with New. It is safe for concurrent
// use.
type Metrics struct {
	reg    prometheus.Registerer
	ns     string
	cfg    Config
	logger *slog.Logger

	eventsProjected *prometheus.CounterVec
	batches         *prometheus.CounterVec
	batchDuration   *prometheus.HistogramVec
	handlerFailures *prometheus.CounterVec
	buildPaced      *prometheus.CounterVec
	staleness       *prometheus.HistogramVec
	lockWait        *prometheus.HistogramVec
	transit         *prometheus.HistogramVec
	relayDelay      *prometheus.HistogramVec

	mu      sync.Mutex
	routers map[*message.Router]bool
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.Namespace = cmp.Or(cfg.Namespace, NamespaceDefault)
	if cfg.BatchDurationBuckets == nil {
		cfg.BatchDurationBuckets = BatchDurationBucketsDefault()
	}
	if cfg.StalenessBuckets == nil {
		cfg.StalenessBuckets = StalenessBucketsDefault()
	}
	cfg.QueryTimeout = cmp.Or(cfg.QueryTimeout, QueryTimeoutDefault)
	cfg.CacheTTL = cmp.Or(cfg.CacheTTL, CacheTTLDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.Registerer == nil {
		return fmt.Errorf("%w: Config.Registerer is nil; pass a registry of yours (prometheus.NewRegistry()) "+
			"or prometheus.DefaultRegisterer", ErrInvalidConfig)
	}
	if !namespaceRE.MatchString(cfg.Namespace) {
		return fmt.Errorf("%w: namespace %q is not a Prometheus name (letters, digits and _, not starting with a digit)",
			ErrInvalidConfig, cfg.Namespace)
	}
	if !increasing(cfg.BatchDurationBuckets) {
		return fmt.Errorf("%w: BatchDurationBuckets %v must increase strictly", ErrInvalidConfig, cfg.BatchDurationBuckets)
	}
	if !increasing(cfg.StalenessBuckets) {
		return fmt.Errorf("%w: StalenessBuckets %v must increase strictly", ErrInvalidConfig, cfg.StalenessBuckets)
	}
	if cfg.QueryTimeout < 0 {
		return fmt.Errorf("%w: QueryTimeout %s is negative", ErrInvalidConfig, cfg.QueryTimeout)
	}
	return nil
}

// New returns Metrics with its batch metrics registered on cfg.Registerer. The scrape-time
// metrics are added by WatchRunner, WatchWorker and WatchDeadLetters.
func New(cfg Config) (*Metrics, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Metrics{reg: cfg.Registerer, ns: cfg.Namespace, cfg: cfg, logger: cfg.Logger, routers: map[*message.Router]bool{}}
	m.eventsProjected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "events_projected_total",
		Help: "Events handled and committed by the projection's batches in this process.",
	}, []string{"projection"})
	m.batches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "batches_total",
		Help: "Projection batches run in this process, by outcome: committed, failed (a handler failed) or error (the batch could not run).",
	}, []string{"projection", "outcome"})
	m.batchDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "batch_duration_seconds",
		Help:    "Wall time of projection batches in this process, from start to commit or rollback, whatever the outcome.",
		Buckets: cfg.BatchDurationBuckets,
	}, []string{"projection"})
	m.handlerFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "handler_failures_total",
		Help: "Batches rolled back because a handler failed, by the type of the event it failed on.",
	}, []string{"projection", "event_type"})
	m.buildPaced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "build_paced_seconds_total",
		Help: "Time a version built beside the active one waited between its batches for the active version's lag (Config.BuildLagTarget).",
	}, []string{"projection"})
	m.staleness = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "event_staleness_seconds",
		Help: "Per event handled, the time from its recording in the store to the commit of the batch that applied it, " +
			"both in the database's clock (an upper bound of commit to commit by what the append did after its insert).",
		Buckets: cfg.StalenessBuckets,
	}, []string{"projection"})
	m.lockWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "batch_lock_wait_seconds",
		Help:    "Per committed batch, the time from its start to holding the projection's lock: a connection, BEGIN and the wait for another batch of the projection.",
		Buckets: cfg.BatchDurationBuckets,
	}, []string{"projection"})
	m.transit = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: "projection", Name: "trigger_transit_seconds",
		Help: "Per append trigger a projection's handler received, the time from its making (the relay's publish or the append) to its arrival, " +
			"in the hosts' clocks: skew between the publishing and the consuming host adds to it.",
		Buckets: cfg.StalenessBuckets,
	}, []string{"projection"})
	m.relayDelay = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: m.ns, Subsystem: "relay", Name: "delay_seconds",
		Help: "Per event the relay published a trigger for, the time from its recording in the store to the commit of the relay's position after the publish, " +
			"both in the database's clock: the relay's part of the events' staleness.",
		Buckets: cfg.StalenessBuckets,
	}, []string{"relay"})
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m.eventsProjected, m.batches, m.batchDuration, m.handlerFailures, m.buildPaced, m.staleness, m.lockWait, m.transit, m.relayDelay} {
		if err := m.register("the batch metrics", c); err != nil {
			for _, d := range done {
				m.reg.Unregister(d)
			}
			return nil, err
		}
		done = append(done, c)
	}
	return m, nil
}

// register registers c, naming what it is in the error.
func (m *Metrics) register(what string, c prometheus.Collector) error {
	err := m.reg.Register(c)
	if err == nil {
		return nil
	}
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return fmt.Errorf("%w: %s (namespace %q) on this Registerer: %w", ErrAlreadyRegistered, what, m.ns, err)
	}
	return fmt.Errorf("metrics: register %s (namespace %q): %w", what, m.ns, err)
}

// ObserveBatch records one batch of a runner. Pass it as projection.RunnerConfig.OnBatch; it
// is fast and safe for concurrent use.
func (m *Metrics) ObserveBatch(b projection.BatchReport) {
	outcome := OutcomeCommitted
	var he *projection.HandlerError
	switch {
	case b.Err == nil:
		m.eventsProjected.WithLabelValues(b.Projection).Add(float64(b.Events))
		m.observeStaleness(b)
	case errors.As(b.Err, &he):
		outcome = OutcomeFailed
		m.handlerFailures.WithLabelValues(b.Projection, he.Event.Type).Inc()
	case errors.Is(b.Err, projection.ErrHandler):
		outcome = OutcomeFailed
		m.handlerFailures.WithLabelValues(b.Projection, "").Inc()
	default:
		outcome = OutcomeError
	}
	m.batches.WithLabelValues(b.Projection, outcome).Inc()
	m.batchDuration.WithLabelValues(b.Projection).Observe(b.Took.Seconds())
}

// observeStaleness records a committed batch's event staleness and lock wait.
func (m *Metrics) observeStaleness(b projection.BatchReport) {
	if len(b.Staleness) > 0 {
		h := m.staleness.WithLabelValues(b.Projection)
		for _, d := range b.Staleness {
			h.Observe(d.Seconds())
		}
	}
	if b.Events > 0 {
		m.lockWait.WithLabelValues(b.Projection).Observe(b.LockWait.Seconds())
	}
}

// ObserveTrigger records an append trigger's transit, from its making to its arrival at a
// projection's handler. Pass it as worker.Config.TriggerFunc (the client does, with
// nudge.Config.Metrics); it is fast and safe for concurrent use.
func (m *Metrics) ObserveTrigger(r worker.TriggerReport) {
	if r.Trigger.At.IsZero() {
		return
	}
	m.transit.WithLabelValues(r.Projection).Observe(max(r.Received.Sub(r.Trigger.At), 0).Seconds())
}

// ObserveRelay records a relay's batch: per event it published a trigger for, the relay's
// delay (nudge_relay_delay_seconds, label relay: the relay's name). Pass it as
// relay.Config.BatchFunc (the client does, with nudge.Config.Metrics); it is fast and safe for
// concurrent use. A failed batch records nothing: its events are published again.
func (m *Metrics) ObserveRelay(b projection.BatchReport) {
	if b.Err != nil || len(b.Staleness) == 0 {
		return
	}
	h := m.relayDelay.WithLabelValues(b.Projection)
	for _, d := range b.Staleness {
		h.Observe(d.Seconds())
	}
}

// ObserveCatchUp records one catch-up of a runner: the time a building version waited for the
// active version's lag. Pass it as projection.RunnerConfig.OnCatchUp; it is fast and safe for
// concurrent use.
func (m *Metrics) ObserveCatchUp(name string, res projection.Result, _ error) {
	if res.Paced > 0 {
		m.buildPaced.WithLabelValues(name).Add(res.Paced.Seconds())
	}
}

// initBatchSeries creates the batch series of the named projections at zero, so that they
// exist (and rate() works) before the first batch.
func (m *Metrics) initBatchSeries(names []string) {
	for _, name := range names {
		m.eventsProjected.WithLabelValues(name)
		for _, o := range Outcomes() {
			m.batches.WithLabelValues(name, o)
		}
	}
}

// checkNames refuses an empty or repeated name.
func checkNames(what string, names []string) error {
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" {
			return fmt.Errorf("%w: %s: an empty projection name", ErrInvalidConfig, what)
		}
		if seen[n] {
			return fmt.Errorf("%w: %s: projection %s is named twice", ErrInvalidConfig, what, n)
		}
		seen[n] = true
	}
	return nil
}

func wrapInvalid(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, msg) }
