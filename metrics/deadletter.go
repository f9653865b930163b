package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/deadletter"
)

// DeadLetterPageSize is how many failed dead letters WatchDeadLetters's collector lists at a
// time.
const DeadLetterPageSize = 1000

// DeadLetterLister is what WatchDeadLetters needs of a dead-letter store; every
// deadletter.Store satisfies it.
type DeadLetterLister interface {
	// List returns the records f selects, by ascending ID.
	List(ctx context.Context, f deadletter.Filter) ([]deadletter.Record, error)
}

// WatchDeadLetters registers a collector that counts the dead letters in status failed per
// projection at scrape time (records, not deliveries: the entries of one failing event fold
// into one record). The named projections are always shown, at 0 when they have none; so is a
// projection once it has been seen with failed dead letters, so its series goes back to 0
// instead of vanishing. Pass runner.Names().
//
// The store has no count query: the collector lists the failed records, DeadLetterPageSize at
// a time, within Config.QueryTimeout. Folding keeps them few (one per projection and failing
// event, plus undecodable triggers). One store per Metrics: a second call fails with an error
// matching ErrAlreadyRegistered.
func (m *Metrics) WatchDeadLetters(store DeadLetterLister, names ...string) error {
	if store == nil {
		return wrapInvalid("WatchDeadLetters needs a dead-letter store, got nil")
	}
	if err := checkNames("WatchDeadLetters", names); err != nil {
		return err
	}
	c := &deadLetterCollector{
		failed: prometheus.NewDesc(prometheus.BuildFQName(m.ns, "dead_letters", "failed"),
			"Dead-letter records in status failed, waiting for a replay or an operator.", []string{"projection"}, nil),
		known: make(map[string]bool, len(names)),
	}
	for _, n := range names {
		c.known[n] = true
	}
	c.query = newQuery(m, SourceDeadLetters, func(ctx context.Context) (map[string]int, int) {
		counts, err := countFailed(ctx, store)
		if err != nil {
			m.logger.WarnContext(ctx, "metrics: counting failed dead letters failed; the gauge is left out of this scrape",
				slog.Any("error", err))
			return nil, 1
		}
		return counts, 0
	})
	return m.register("WatchDeadLetters's collector", c)
}

// countFailed counts the failed records per projection.
func countFailed(ctx context.Context, store DeadLetterLister) (map[string]int, error) {
	counts := map[string]int{}
	f := deadletter.Filter{Status: []deadletter.Status{deadletter.StatusFailed}, Limit: DeadLetterPageSize}
	for {
		page, err := store.List(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("list failed dead letters after ID %d: %w", f.AfterID, err)
		}
		for _, r := range page {
			counts[r.Projection]++
		}
		if len(page) < f.Limit {
			return counts, nil
		}
		f.AfterID = page[len(page)-1].ID
	}
}

type deadLetterCollector struct {
	failed *prometheus.Desc
	query  *query[map[string]int]

	mu    sync.Mutex
	known map[string]bool // projections shown even at 0
}

// Describe implements prometheus.Collector.
func (c *deadLetterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.failed
	c.query.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *deadLetterCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.query.get(ch)
	if counts == nil {
		return // the query failed
	}
	c.mu.Lock()
	for name := range counts {
		c.known[name] = true
	}
	names := slices.Sorted(maps.Keys(c.known))
	c.mu.Unlock()
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, float64(counts[name]), name)
	}
}
