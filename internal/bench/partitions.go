package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
)

// targetPartitionWork: reading the log as many partitions must not cost much more than
// reading it whole (issue 19: the read for one partition does not scan the others' events).
// Work is counted two ways: the events and index entries the server reads (no event of
// another partition may be read), and the shared buffer blocks it pins for them.
var (
	targetPartitionTuples = Target{Name: "read work of 16 partitioned readers, of 1 unpartitioned reader: events table tuples read", Op: AtMost, Threshold: 2, Unit: "×"}
	targetPartitionBlocks = Target{Name: "read work of 16 partitioned readers, of 1 unpartitioned reader: events table blocks", Op: AtMost, Threshold: 2, Unit: "×"}
)

const (
	// partitionCount is how many partitioned readers share the log.
	partitionCount = 16
	// partitionPage is each reader's Read limit.
	partitionPage = 1000
	// partitionAppendWriters append concurrently when the append cost is measured.
	partitionAppendWriters = 8
)

// partitionWork is what the events table cost the server during one read of the whole log:
// pg_statio_user_tables / pg_stat_user_tables deltas of nudge_events (its indexes included)
// and pg_stat_database's (the horizon's catalogue reads too).
type partitionWork struct {
	heapBlocks, indexBlocks int64         // shared blocks hit + read
	tuplesFetched           int64         // heap tuples fetched by index scans
	indexTuples             int64         // index entries read, over every index of the table
	databaseBlocks          int64         // the whole database's blocks hit + read
	serverCPU               time.Duration // user + system CPU of the readers' backends, -1 if unknown
	wall                    time.Duration
	events                  int
}

func (w partitionWork) blocks() int64 { return w.heapBlocks + w.indexBlocks }

func (w partitionWork) tuples() int64 { return w.tuplesFetched + w.indexTuples }

func runPartitions(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["partitions"], sec.Params["page"] = sz.partitionEvents, sz.rebuildStreams, partitionCount, partitionPage
	sec.Params["rounds"] = sz.partitionRounds
	table := &Table{Header: []string{"case", "wall ms", "events/s", "server CPU ms", "heap tuples", "index tuples", "ratio (tuples)", "heap blocks", "index blocks", "db blocks", "ratio (blocks)"}}
	sec.table = table
	f, err := h.newFixture(ctx, partitionCount+2)
	if err != nil {
		return err
	}
	defer f.close()
	last, err := loadEvents(f.db.pool, sz.partitionEvents, sz.rebuildStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	started := time.Now()
	if err := f.store.EnsurePartitions(ctx, partitionCount); err != nil {
		return err
	}
	sec.Note("EnsurePartitions(%d) built its index over %s events in %s (CREATE INDEX CONCURRENTLY)",
		partitionCount, Thousands(int64(sz.partitionEvents)), time.Since(started).Round(time.Millisecond))
	if _, err := f.db.pool.Exec(ctx, `VACUUM ANALYZE nudge_events`); err != nil {
		return err
	}
	if err := measurePartitionReads(ctx, h, f, sec, table); err != nil {
		return err
	}
	if err := measureStoredColumn(ctx, f, sec); err != nil {
		return err
	}
	return measurePartitionAppends(ctx, h, sec, table)
}

// measurePartitionReads reads the whole log as one reader and as partitionCount readers,
// alternately, after a warm-up pass of each, and reports the medians.
func measurePartitionReads(ctx context.Context, h *harness, f *fixture, sec *Section, table *Table) error {
	pool, err := f.db.newPool(ctx, partitionCount)
	if err != nil {
		return err
	}
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		return err
	}
	pids, err := backendPIDs(ctx, pool, partitionCount)
	if err != nil {
		return err
	}
	var whole, parts []partitionWork
	for round := -1; round < h.sizes.partitionRounds; round++ { // round -1 warms the caches
		one, err := readPartitioned(ctx, f.db.pool, pool, store, pids, 1)
		if err != nil {
			return fmt.Errorf("one reader: %w", err)
		}
		many, err := readPartitioned(ctx, f.db.pool, pool, store, pids, partitionCount)
		if err != nil {
			return fmt.Errorf("%d readers: %w", partitionCount, err)
		}
		if one.events != h.sizes.partitionEvents || many.events != one.events {
			return fmt.Errorf("read %d events as one reader and %d as %d, want %d", one.events, many.events, partitionCount, h.sizes.partitionEvents)
		}
		if round >= 0 {
			whole, parts = append(whole, one), append(parts, many)
			h.log.InfoContext(ctx, "partitions: round done", slog.Int("round", round+1), slog.Int64("blocks_1", one.blocks()), slog.Int64("blocks_16", many.blocks()))
		}
	}
	one, many := medianWork(whole), medianWork(parts)
	addWorkRow(sec, table, "1 reader, unpartitioned", one, partitionWork{})
	addWorkRow(sec, table, fmt.Sprintf("%d partitioned readers, concurrently", partitionCount), many, one)
	sec.AddCheck(targetPartitionTuples, fmt.Sprintf("%d partitions", partitionCount), Ratio(float64(many.tuples()), float64(one.tuples())))
	sec.AddCheck(targetPartitionBlocks, fmt.Sprintf("%d partitions", partitionCount), Ratio(float64(many.blocks()), float64(one.blocks())))
	sec.Note("work: deltas of pg_statio_user_tables (heap_blks_hit+read, idx_blks_hit+read: table blocks), pg_stat_user_tables.idx_tup_fetch (heap tuples), "+
		"pg_stat_user_indexes.idx_tup_read (index tuples) of nudge_events and pg_stat_database.blks_hit+read (db blocks, the horizon's catalogue reads included); "+
		"each reader's backend flushes its counters (pg_stat_force_next_flush) before they are read; server CPU: utime+stime of the readers' backends (/proc, a local server only); "+
		"median of %d rounds (by blocks) after a warm-up round", h.sizes.partitionRounds)
	sec.Note("the whole log is read to its end in pages of %d: one store.Read loop, or %d concurrent loops each with ReadOptions.Partition{Index: i, Count: %d}, on a pool of %d connections",
		partitionPage, partitionCount, partitionCount, partitionCount)
	sec.Note("heap blocks grow with the partitions: a heap page holds events of every partition (they are stored in append order), so each partitioned reader pins most pages for its few rows there; " +
		"heap tuples and index tuples stay those of one reader: no event of another partition is read")
	return nil
}

// addWorkRow adds a case to the table and the metrics; base is the baseline (zero for the
// baseline itself).
func addWorkRow(sec *Section, table *Table, label string, w, base partitionWork) {
	tuplesRatio, blocksRatio, cpu := "—", "—", "—"
	if w.serverCPU >= 0 {
		cpu = FormatValue(Ms(w.serverCPU), "ms")
	}
	m := Metric{Case: label, Name: "table_tuples", Unit: "tuples", Value: float64(w.tuples()), Extra: map[string]float64{
		"wall_ms": Ms(w.wall), "events_per_s": Rate(w.events, w.wall), "server_cpu_ms": Ms(w.serverCPU), "heap_blocks": float64(w.heapBlocks),
		"index_blocks": float64(w.indexBlocks), "table_blocks": float64(w.blocks()), "heap_tuples": float64(w.tuplesFetched),
		"index_tuples": float64(w.indexTuples), "db_blocks": float64(w.databaseBlocks),
	}}
	if base.events > 0 {
		m = m.WithBaseline("1 reader, unpartitioned", float64(base.tuples()))
		tuplesRatio = FormatValue(m.Ratio, "×")
		blocksRatio = FormatValue(Ratio(float64(w.blocks()), float64(base.blocks())), "×")
		m.Extra["blocks_ratio"] = Ratio(float64(w.blocks()), float64(base.blocks()))
		m.Extra["wall_ratio"] = Ratio(float64(w.wall), float64(base.wall))
		m.Extra["server_cpu_ratio"] = Ratio(float64(w.serverCPU), float64(base.serverCPU))
		m.Extra["db_blocks_ratio"] = Ratio(float64(w.databaseBlocks), float64(base.databaseBlocks))
	}
	sec.AddMetric(m)
	table.Add(label, FormatValue(Ms(w.wall), "ms"), FormatValue(Rate(w.events, w.wall), "events/s"), cpu, Thousands(w.tuplesFetched), Thousands(w.indexTuples),
		tuplesRatio, Thousands(w.heapBlocks), Thousands(w.indexBlocks), Thousands(w.databaseBlocks), blocksRatio)
}

// backendPIDs opens n connections of pool and returns their backends' process ids.
func backendPIDs(ctx context.Context, pool *pgxpool.Pool, n int) ([]int, error) {
	var pids []int
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// backendCPU returns the CPU time (user + system) the processes pids have used, from
// /proc/<pid>/stat; -1 when one cannot be read (a server on another machine).
func backendCPU(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return -1
		}
		// The fields after the command (in parentheses): state is the 3rd, utime the 14th.
		_, rest, ok := strings.Cut(string(stat), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 13 {
			return -1
		}
		for _, f := range fields[11:13] {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return -1
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * (time.Second / clockTicks)
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// readPartitioned reads the whole log as count readers (1: unpartitioned) on pool and returns
// what it cost; admin reads the counters.
func readPartitioned(ctx context.Context, admin, pool *pgxpool.Pool, store *espg.Store, pids []int, count int) (partitionWork, error) {
	before, err := workCounters(ctx, admin, pool)
	if err != nil {
		return partitionWork{}, err
	}
	cpuBefore := backendCPU(pids)
	var (
		wg     sync.WaitGroup
		events atomic.Int64
		errs   = make([]error, count)
	)
	started := time.Now()
	for i := range count {
		wg.Go(func() {
			n, err := readToEnd(ctx, store, eventstore.Partition{Index: i, Count: count})
			events.Add(int64(n))
			errs[i] = err
		})
	}
	wg.Wait()
	wall := time.Since(started)
	cpu := backendCPU(pids)
	if cpu >= 0 && cpuBefore >= 0 {
		cpu -= cpuBefore
	} else {
		cpu = -1
	}
	if err := errors.Join(errs...); err != nil {
		return partitionWork{}, err
	}
	after, err := workCounters(ctx, admin, pool)
	if err != nil {
		return partitionWork{}, err
	}
	return partitionWork{
		heapBlocks: after.heapBlocks - before.heapBlocks, indexBlocks: after.indexBlocks - before.indexBlocks,
		tuplesFetched: after.tuplesFetched - before.tuplesFetched, indexTuples: after.indexTuples - before.indexTuples,
		databaseBlocks: after.databaseBlocks - before.databaseBlocks, serverCPU: cpu, wall: wall, events: int(events.Load()),
	}, nil
}

// readToEnd reads partition p from the start until a page comes back empty.
func readToEnd(ctx context.Context, store *espg.Store, p eventstore.Partition) (int, error) {
	deadline := time.Now().Add(horizonReadDeadline)
	var after eventstore.Position
	n := 0
	for {
		events, err := store.Read(ctx, after, eventstore.ReadOptions{Limit: partitionPage, Partition: p})
		if err != nil {
			return n, err
		}
		if len(events) == 0 {
			return n, nil
		}
		n += len(events)
		after = events[len(events)-1].Position
		if time.Now().After(deadline) {
			return n, fmt.Errorf("partition %s: read %d events in %s, not done", p, n, horizonReadDeadline)
		}
	}
}

// workCounters flushes the statistics of every connection of pool and reads the counters of
// nudge_events and of the database.
func workCounters(ctx context.Context, admin, pool *pgxpool.Pool) (partitionWork, error) {
	for _, c := range pool.AcquireAllIdle(ctx) {
		// The backend reports its counters when it goes idle after this statement.
		_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
		if err != nil {
			return partitionWork{}, err
		}
	}
	var w partitionWork
	err := admin.QueryRow(ctx, `SELECT coalesce(io.heap_blks_hit + io.heap_blks_read, 0), coalesce(io.idx_blks_hit + io.idx_blks_read, 0),
			coalesce(t.idx_tup_fetch, 0), (SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes WHERE relname = 'nudge_events'),
			(SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database())
		FROM pg_statio_user_tables io JOIN pg_stat_user_tables t USING (relid) WHERE io.relname = 'nudge_events'`).
		Scan(&w.heapBlocks, &w.indexBlocks, &w.tuplesFetched, &w.indexTuples, &w.databaseBlocks)
	return w, err
}

// medianWork returns the round with the median table blocks.
func medianWork(rounds []partitionWork) partitionWork {
	sorted := append([]partitionWork(nil), rounds...)
	for i := range sorted { // a few rounds: insertion sort
		for j := i; j > 0 && sorted[j].blocks() < sorted[j-1].blocks(); j-- {
			sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
		}
	}
	return sorted[len(sorted)/2]
}

// measureStoredColumn times what the design suggested first would have cost the loaded store:
// a stored generated stream_hash column, which rewrites the table under an ACCESS EXCLUSIVE
// lock. The partition index computes the hash from stream_id instead, so no migration rewrites
// the events.
func measureStoredColumn(ctx context.Context, f *fixture, sec *Section) error {
	started := time.Now()
	_, err := f.db.pool.Exec(ctx, `ALTER TABLE nudge_events ADD COLUMN stream_hash int
		GENERATED ALWAYS AS (('x' || substr(md5(stream_id), 1, 8))::bit(32)::int) STORED`)
	if err != nil {
		return err
	}
	sec.Note("not taken: a stored generated stream_hash column; adding it rewrote the %s events in %s, every append and read of the store blocked meanwhile (ACCESS EXCLUSIVE)",
		Thousands(f.eventsLoaded(ctx)), time.Since(started).Round(time.Millisecond))
	_, err = f.db.pool.Exec(ctx, `ALTER TABLE nudge_events DROP COLUMN stream_hash`)
	return err
}

// eventsLoaded counts the fixture's events (0 when it cannot).
func (f *fixture) eventsLoaded(ctx context.Context) int64 {
	var n int64
	_ = f.db.pool.QueryRow(ctx, `SELECT count(*) FROM nudge_events`).Scan(&n)
	return n
}

// measurePartitionAppends measures append throughput on a store without and with the index
// of 16 partitions, in alternating rounds on fresh stores: what a partition count in use costs
// every append.
func measurePartitionAppends(ctx context.Context, h *harness, sec *Section, table *Table) error {
	var without, with []float64
	for range h.sizes.appendRounds {
		for _, partitioned := range []bool{false, true} {
			rate, err := appendRate(ctx, h, partitioned)
			if err != nil {
				return err
			}
			if partitioned {
				with = append(with, rate)
			} else {
				without = append(without, rate)
			}
		}
	}
	base, rate := median(without), median(with)
	sec.AddMetric(Metric{Case: "appends, no partition index", Name: "events_per_s", Unit: "events/s", Value: base})
	sec.AddMetric(Metric{Case: fmt.Sprintf("appends, index of %d partitions", partitionCount), Name: "events_per_s", Unit: "events/s", Value: rate}.
		WithBaseline("appends, no partition index", base))
	table.Add("appends, no partition index", "", FormatValue(base, "events/s"), "", "", "", "", "", "", "", "")
	table.Add(fmt.Sprintf("appends, index of %d partitions", partitionCount), "", FormatValue(rate, "events/s"), "", "", "", "", "", "", "", FormatValue(Ratio(rate, base), "×")+" (rate)")
	sec.Note("appends: %d writers, one event per Append, %s per round, median of %d rounds, alternating a store without and one with the partition index",
		partitionAppendWriters, h.sizes.appendRun, h.sizes.appendRounds)
	return nil
}

// appendRate appends for h.sizes.appendRun on a fresh store, with the index of partitionCount
// partitions or without, and returns the events appended per second.
func appendRate(ctx context.Context, h *harness, partitioned bool) (float64, error) {
	f, err := h.newFixture(ctx, partitionAppendWriters+2)
	if err != nil {
		return 0, err
	}
	defer f.close()
	if partitioned {
		if err := f.store.EnsurePartitions(ctx, partitionCount); err != nil {
			return 0, err
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, h.sizes.appendRun)
	defer cancel()
	var (
		wg       sync.WaitGroup
		appended atomic.Int64
		errs     = make([]error, partitionAppendWriters)
	)
	started := time.Now()
	for w := range partitionAppendWriters {
		wg.Go(func() {
			for i := 0; runCtx.Err() == nil; i++ {
				stream := fmt.Sprintf("writer-%d-%d", w, i%appendStreamsPerWriter)
				_, err := f.store.Append(runCtx, stream, eventstore.Any, eventstore.EventData{Type: rebuildEventType, Payload: []byte(ticketPayload(stream, i))})
				if err != nil {
					if runCtx.Err() == nil {
						errs[w] = err
					}
					return
				}
				appended.Add(1)
			}
		})
	}
	wg.Wait()
	return Rate(int(appended.Load()), time.Since(started)), errors.Join(errs...)
}
