package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgcluster"
)

// targetHorizonReads is how much of its throughput a reader may lose to many open connections,
// some of them holding exempt transactions (the horizon then scans the lock table).
var targetHorizonReads = Target{Name: "read throughput with many connections open, of without", Op: AtLeast, Threshold: 50, Unit: "%"}

const (
	// horizonPage is the Read limit of the reader.
	horizonPage = 500
	// horizonReserve is how many of the server's connections the crowd leaves to others.
	horizonReserve = 20
	// horizonIdleTxEvery: every third idle connection of the crowd sits idle in a transaction.
	horizonIdleTxEvery = 3
	// horizonReadDeadline bounds one pass over the store.
	horizonReadDeadline = 2 * time.Minute
	// horizonCallBudget bounds the horizon calls of each kind in one round of one condition.
	horizonCallBudget = 20 * time.Second
)

// horizonResult is what was measured under one condition, over every round.
type horizonResult struct {
	rates   []float64       // events/s of each pass
	horizon []time.Duration // SELECT <store.HorizonSQL()>, round trips
	server  []time.Duration // its execution time in the server (EXPLAIN ANALYZE)
	locks   lockSample      // the last sample
	commits []float64       // the crowd's commits/s in each round
}

// lockSample is what pg_locks held at one moment.
type lockSample struct {
	rows, xids, exempt int
}

// rate is the median events/s.
func (r horizonResult) rate() float64 { return median(r.rates) }

func runHorizon(ctx context.Context, shared *harness, sec *Section) error {
	// A private cluster: room for the connections asked for (the shared server's
	// max_connections is often 100), and no other work's transactions in the lock table.
	h, cleanup, err := shared.privateCluster(ctx, shared.sizes.horizonConnections+horizonReserve+20)
	if err != nil {
		shared.log.WarnContext(ctx, "horizon: no private cluster; measuring on the shared server", slog.Any("error", err))
		sec.Note("no private PostgreSQL cluster could be started (%v): measured on the shared server, beside its other work", err)
		h, cleanup = shared, func() {}
	} else {
		sec.Note("measured on a private PostgreSQL cluster of its own (same server programs, max_connections %d, fsync off)",
			shared.sizes.horizonConnections+horizonReserve+20)
	}
	defer cleanup()
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["page"] = sz.horizonEvents, sz.rebuildStreams, horizonPage
	sec.Params["rounds"], sec.Params["horizon_calls"], sec.Params["writer_hold_ms"] = sz.horizonRounds, sz.horizonCalls, Ms(crowdHold)
	table := &Table{Header: []string{"case", "events/s", "p50 ms", "p99 ms", "server p50 ms", "server p99 ms", "baseline", "ratio"}}
	sec.table = table

	f, err := h.newFixture(ctx, 4)
	if err != nil {
		return err
	}
	defer f.close()
	last, err := loadEvents(f.db.pool, sz.horizonEvents, sz.rebuildStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	// The reader: a store on one connection of its own.
	readerPool, err := f.db.newPool(ctx, 1)
	if err != nil {
		return err
	}
	hb := &horizonBench{h: h, pool: readerPool, calls: max(1, sz.horizonCalls/sz.horizonRounds)}
	if hb.reader, err = espg.New(readerPool, espg.Config{}); err != nil {
		return err
	}
	if _, err := readAll(ctx, hb.reader, sz.horizonEvents); err != nil { // warms the caches
		return fmt.Errorf("warm-up read: %w", err)
	}
	cfg, crowdCase, fewer, err := h.crowdFor(ctx, f)
	if err != nil {
		return err
	}
	var alone, with horizonResult
	for round := range sz.horizonRounds {
		if err := hb.measure(ctx, &alone, nil); err != nil {
			return fmt.Errorf("without other connections: %w", err)
		}
		if err := hb.measureWith(ctx, &with, cfg); err != nil {
			return fmt.Errorf("with %s: %w", crowdCase, err)
		}
		h.log.InfoContext(ctx, "horizon: round done", slog.Int("round", round+1), slog.Float64("alone_events_per_s", alone.rates[round]),
			slog.Float64("with_events_per_s", with.rates[round]))
	}
	reportHorizon(sec, table, alone, with, crowdCase, fewer, hb.calls*sz.horizonRounds)
	sec.Note("writers: %s transactions/s (median of the rounds), each BEGIN exempt from the horizon (store.ExemptTxOptions), INSERT into a scratch table, %s open, COMMIT (synchronous_commit off)",
		FormatValue(median(with.commits), ""), crowdHold)
	sec.Note("pg_locks once during the last round's read: %d rows, %d transaction ids, %d horizon exemptions; without the connections: %d rows",
		with.locks.rows, with.locks.xids, with.locks.exempt, alone.locks.rows)
	sec.Note("read: store.Read from position zero to the end, limit %d, on one connection, median of %d rounds after a warm-up pass; "+
		"each round measures without, then opens the connections, measures with them and closes them", horizonPage, sz.horizonRounds)
	return nil
}

// privateCluster starts a private PostgreSQL cluster with maxConns connections and returns a
// harness whose databases live there, and the function that removes it.
func (h *harness) privateCluster(ctx context.Context, maxConns int) (*harness, func(), error) {
	c, err := pgcluster.NewWith(ctx, h.libLog, pgcluster.Options{MaxConnections: maxConns})
	if err != nil {
		return nil, nil, err
	}
	opts := h.opts
	opts.postgresURL = c.URL("postgres", "")
	admin, err := pgxpool.New(ctx, opts.postgresURL)
	if err != nil {
		c.Remove(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	p := &harness{opts: opts, sizes: h.sizes, admin: admin, runID: h.runID, log: h.log, libLog: h.libLog}
	return p, func() { admin.Close(); c.Remove(context.WithoutCancel(ctx)) }, nil
}

// horizonBench measures a reader on one connection.
type horizonBench struct {
	h      *harness
	reader *espg.Store
	pool   *pgxpool.Pool // the reader's
	calls  int           // horizon statements of each kind per round
}

// measureWith opens the crowd, measures one round with it and closes it.
func (hb *horizonBench) measureWith(ctx context.Context, res *horizonResult, cfg crowdConfig) error {
	c, err := openCrowd(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open %d connections: %w", cfg.idle+cfg.writers, err)
	}
	defer c.close()
	if err := hb.measure(ctx, res, c); err != nil {
		return err
	}
	res.commits = append(res.commits, c.commitRate())
	return nil
}

// crowdFor sizes the crowd: h.sizes.horizonConnections, or as many as the server's
// max_connections leaves beside the connections open now and horizonReserve, in the same
// ratio of writers to idle ones. It returns the crowd's configuration, its description and,
// when it is smaller than asked, why.
func (h *harness) crowdFor(ctx context.Context, f *fixture) (cfg crowdConfig, label, fewer string, err error) {
	var maxConns, inUse int
	if err := f.db.pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		(SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&maxConns, &inUse); err != nil {
		return cfg, "", "", err
	}
	want := h.sizes.horizonConnections
	n := min(want, maxConns-horizonReserve-inUse)
	if n < 4 {
		return cfg, "", "", fmt.Errorf("the server has no room for more connections (max_connections %d, %d in use, %d kept free); raise max_connections",
			maxConns, inUse, horizonReserve)
	}
	writers := max(1, (n*h.sizes.horizonWriters+want/2)/want)
	cfg = crowdConfig{url: f.db.url, idle: n - writers, idleTxEvery: horizonIdleTxEvery, writers: writers,
		writeTx: f.store.ExemptTxOptions(pgx.TxOptions{})}
	idleTx := cfg.idle / horizonIdleTxEvery
	label = fmt.Sprintf("+%d connections (%d idle, %d idle in transaction, %d writing)", n, cfg.idle-idleTx, idleTx, writers)
	if n < want {
		fewer = fmt.Sprintf("; %d do not fit: max_connections %d, %d in use, %d kept free", want, maxConns, inUse, horizonReserve)
	}
	h.log.InfoContext(ctx, "horizon: opening connections", slog.Int("connections", n), slog.Int("writers", writers),
		slog.Int("max_connections", maxConns), slog.Int("in_use", inUse))
	return cfg, label, fewer, nil
}

// measure reads the whole store once, samples pg_locks and times the horizon alone, into res;
// c, when not nil, is the crowd that must still be writing at the end.
func (hb *horizonBench) measure(ctx context.Context, res *horizonResult, c *crowd) error {
	started := time.Now()
	n, err := readAll(ctx, hb.reader, hb.h.sizes.horizonEvents)
	if err != nil {
		return err
	}
	res.rates = append(res.rates, Rate(n, time.Since(started)))
	res.locks = sampleLocks(ctx, hb.pool)
	samples, err := horizonCalls(ctx, hb.pool, hb.reader.HorizonSQL(), hb.calls, false)
	if err != nil {
		return err
	}
	res.horizon = append(res.horizon, samples...)
	if samples, err = horizonCalls(ctx, hb.pool, hb.reader.HorizonSQL(), hb.calls, true); err != nil {
		return err
	}
	res.server = append(res.server, samples...)
	if c != nil {
		return c.failure()
	}
	return nil
}

// readAll pages through the store from position zero and returns the events read, which must
// be want.
func readAll(ctx context.Context, store *espg.Store, want int) (int, error) {
	deadline := time.Now().Add(horizonReadDeadline)
	var after eventstore.Position
	n := 0
	for page := 0; page <= want/horizonPage+1; page++ {
		events, err := store.Read(ctx, after, eventstore.ReadOptions{Limit: horizonPage})
		if err != nil {
			return n, err
		}
		n += len(events)
		if len(events) < horizonPage {
			break
		}
		after = events[len(events)-1].Position
		if time.Now().After(deadline) {
			return n, fmt.Errorf("read %d of %d events in %s", n, want, horizonReadDeadline)
		}
	}
	if n != want {
		return n, fmt.Errorf("read %d events, want %d", n, want)
	}
	return n, nil
}

// horizonCalls times up to calls statements SELECT <horizon>, within horizonCallBudget: the
// round trips, or with server the execution times EXPLAIN ANALYZE reports (planning, the
// network and the client left out).
func horizonCalls(ctx context.Context, pool *pgxpool.Pool, horizon string, calls int, server bool) ([]time.Duration, error) {
	q := `SELECT ` + horizon
	if server {
		q = `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) ` + q
	}
	deadline := time.Now().Add(horizonCallBudget)
	samples := make([]time.Duration, 0, calls)
	for i := 0; i < calls && time.Now().Before(deadline); i++ {
		if server {
			var plan []struct {
				ExecutionTime float64 `json:"Execution Time"`
			}
			if err := pool.QueryRow(ctx, q).Scan(&plan); err != nil || len(plan) != 1 {
				return nil, fmt.Errorf("EXPLAIN ANALYZE the horizon: %w (%d plans)", err, len(plan))
			}
			samples = append(samples, time.Duration(plan[0].ExecutionTime*float64(time.Millisecond)))
			continue
		}
		var x *uint64
		started := time.Now()
		if err := pool.QueryRow(ctx, q).Scan(&x); err != nil {
			return nil, fmt.Errorf("SELECT the horizon: %w", err)
		}
		samples = append(samples, time.Since(started))
	}
	return samples, nil
}

// sampleLocks counts the rows of pg_locks now, the transaction ids among them and the store's
// horizon exemptions (advisory locks of class 1852340846); zero if unknown.
func sampleLocks(ctx context.Context, pool *pgxpool.Pool) lockSample {
	var s lockSample
	_ = pool.QueryRow(ctx, `SELECT count(*)::int, (count(*) FILTER (WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock'))::int,
		(count(*) FILTER (WHERE locktype = 'advisory' AND classid = 1852340846))::int FROM pg_locks`).Scan(&s.rows, &s.xids, &s.exempt)
	return s
}

// reportHorizon adds the rows, metrics and the check.
func reportHorizon(sec *Section, table *Table, alone, with horizonResult, crowdCase, fewer string, calls int) {
	readAlone, readWith := "store.Read, no other connections", "store.Read, "+crowdCase+fewer
	hzAlone, hzWith := "SELECT horizon, no other connections", "SELECT horizon, "+crowdCase
	sec.AddMetric(Metric{Case: readAlone, Name: "events_per_s", Unit: "events/s", Value: alone.rate(), Extra: passesExtra(alone.rates)})
	m := Metric{Case: readWith, Name: "events_per_s", Unit: "events/s", Value: with.rate(), Extra: passesExtra(with.rates)}.
		WithBaseline(readAlone, alone.rate())
	sec.AddMetric(m)
	table.Add(readAlone, FormatValue(alone.rate(), ""), "", "", "", "", "", "")
	table.Add(readWith, FormatValue(with.rate(), ""), "", "", "", "", FormatValue(alone.rate(), ""), FormatValue(m.Ratio, "×"))

	aloneRT, aloneServer := Summarize(alone.horizon), Summarize(alone.server)
	withRT, withServer := Summarize(with.horizon), Summarize(with.server)
	horizonMetric := func(c string, rt, server Latency, locks lockSample) Metric {
		extra := rt.Extra()
		for k, v := range server.Extra() {
			extra["server_"+k] = v
		}
		extra["pg_locks_rows"], extra["pg_locks_exempt"] = float64(locks.rows), float64(locks.exempt)
		return Metric{Case: c, Name: "p50_ms", Unit: "ms", Value: Ms(rt.P50), Extra: extra}
	}
	sec.AddMetric(horizonMetric(hzAlone, aloneRT, aloneServer, alone.locks))
	hm := horizonMetric(hzWith, withRT, withServer, with.locks).WithBaseline(hzAlone, Ms(aloneRT.P50))
	sec.AddMetric(hm)
	latencies := func(rt, server Latency) []string {
		return []string{FormatValue(Ms(rt.P50), "ms"), FormatValue(Ms(rt.P99), "ms"), FormatValue(Ms(server.P50), "ms"), FormatValue(Ms(server.P99), "ms")}
	}
	table.Add(append(append([]string{hzAlone, ""}, latencies(aloneRT, aloneServer)...), "", "")...)
	table.Add(append(append([]string{hzWith, ""}, latencies(withRT, withServer)...), FormatValue(Ms(aloneRT.P50), "ms")+" ms", FormatValue(hm.Ratio, "×"))...)
	sec.AddCheck(targetHorizonReads, crowdCase+fewer, 100*m.Ratio)
	sec.Note("horizon: %d round trips and %d EXPLAIN ANALYZE without the connections, %d and %d with them (at most %d each, within %s a round); server: its execution time there",
		aloneRT.Count, aloneServer.Count, withRT.Count, withServer.Count, calls, horizonCallBudget)
}

// median is the median of xs (the upper middle one of an even count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// passesExtra are the rates of each pass, as a metric's extra figures.
func passesExtra(rates []float64) map[string]float64 {
	return map[string]float64{"passes": float64(len(rates)), "min_events_per_s": slices.Min(rates), "max_events_per_s": slices.Max(rates)}
}
