package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sources of scrape-time queries, the values of the source label of
// nudge_metrics_collect_errors_total and nudge_metrics_collect_duration_seconds.
const (
	// SourceStatus: the projections' statuses (WatchRunner).
	SourceStatus = "status"
	// SourceDeadLetters: the failed dead letters (WatchDeadLetters).
	SourceDeadLetters = "dead_letters"
)

// query runs a scrape-time query at most once per ttl, with a timeout, and shares its result
// between concurrent scrapes (they wait for the one in flight). It also exposes how many of its
// queries failed and how long the last one took.
type query[T any] struct {
	timeout, ttl time.Duration
	// fetch runs the query; it returns what it could read and how many parts failed (it logs
	// each failure itself).
	fetch func(ctx context.Context) (T, int)

	errorsDesc, durationDesc *prometheus.Desc

	mu   sync.Mutex
	at   time.Time // when last was fetched; zero before the first query
	last T
	errs float64 // failures since the start
	took time.Duration
}

func newQuery[T any](m *Metrics, source string, fetch func(ctx context.Context) (T, int)) *query[T] {
	labels := prometheus.Labels{"source": source}
	return &query[T]{
		timeout: m.cfg.QueryTimeout, ttl: m.cfg.CacheTTL, fetch: fetch,
		errorsDesc: prometheus.NewDesc(prometheus.BuildFQName(m.ns, "metrics", "collect_errors_total"),
			"Scrape-time queries that failed or timed out; their metrics were left out of that scrape.", nil, labels),
		durationDesc: prometheus.NewDesc(prometheus.BuildFQName(m.ns, "metrics", "collect_duration_seconds"),
			"How long the last scrape-time query took.", nil, labels),
	}
}

// describe sends the query's own descriptors.
func (q *query[T]) describe(ch chan<- *prometheus.Desc) {
	ch <- q.errorsDesc
	ch <- q.durationDesc
}

// get returns the current result, querying if the cached one is older than ttl, and sends the
// query's own metrics.
func (q *query[T]) get(ch chan<- prometheus.Metric) T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.at.IsZero() || q.ttl < 0 || time.Since(q.at) >= q.ttl {
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		start := time.Now()
		val, failed := q.fetch(ctx)
		cancel()
		q.at, q.last = time.Now(), val
		q.took = q.at.Sub(start)
		q.errs += float64(failed)
	}
	ch <- prometheus.MustNewConstMetric(q.errorsDesc, prometheus.CounterValue, q.errs)
	ch <- prometheus.MustNewConstMetric(q.durationDesc, prometheus.GaugeValue, q.took.Seconds())
	return q.last
}
