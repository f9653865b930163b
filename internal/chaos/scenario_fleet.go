package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/lease"
)

// The scale-fleet scenario's sizes: many workers on many partitioned projections.
const (
	fleetProjections = 50
	fleetPartitions  = 64
	fleetWriters     = 4
	// fleetRate is low: every event is applied by the 50 projections, mostly each in a
	// transaction of its own (an event's partition rarely has another event in the same
	// trigger), so the database commits up to fleetRate × 50 batches a second. At 40 events/s
	// the 2-core machine fell ever further behind (about 420 commits/s with 8 workers, load
	// average 50–60), and joining workers took minutes to start their handlers.
	fleetRate      = 10
	fleetPerAppend = 3
	// fleetRelayInterval coalesces the appends of a quarter second into one trigger.
	fleetRelayInterval = 250 * time.Millisecond
	// fleetJoinBound and fleetKillBound bound the convergence of the 3,200 partitions after
	// joins and graceful stops, and after SIGKILLs (every worker declares 3,250 queues and
	// subscribes to its share of the units first).
	fleetJoinBound  = 60 * time.Second
	fleetKillBound  = 40 * time.Second
	fleetReadyBound = 4 * time.Minute
)

// brokerHandshakeTimeout is the private RabbitMQ node's handshake timeout, and that of the
// clients of a scenario with slowHandshakes (scale-fleet).
const brokerHandshakeTimeout = time.Minute

// workerConnections is the most PostgreSQL connections a chaosworker process of scale-fleet
// opens: its pool (12), its at-least-once model's (4) and the worker's lease pool (2,
// worker.Leases). Sixteen workers take 288, more than a private cluster's default
// max_connections: a worker past it waits for a connection and never gets ready.
const workerConnections = 12 + 4 + 2

// fleetSplit is how many of the fleet's projections are split into fleetPartitions
// (-fleet-split, 1 to fleetProjections): chaos_exact and the first fleet projections; the
// others are unpartitioned, a queue each. At 8, the 16 workers share 8 lease groups of 64
// partitions (512 partition units, 554 queues). At 50 every projection is split (3,200 units,
// 3,250 queues): this 2-core machine did not host that with 16 workers (RELIABILITY.md).
var fleetSplit = 8

// fleetWorkers is how many worker processes scale-fleet scales up to (-fleet-workers, at least
// 8): half of them first, then all; then 2 are SIGKILLed, 3 stopped with SIGTERM, 1 SIGKILLed.
var fleetWorkers = 16

// fleetScenario: 50 projections, fleetSplit of them split into 64 partitions, on up to 16
// worker processes, with SIGKILLs and SIGTERMs. Not in "all": it takes minutes.
func fleetScenario() scenario {
	return scenario{
		name:  "scale-fleet",
		optIn: true,
		injects: fmt.Sprintf("%d exactly-once projections (chaos_exact and chaos_fleet_NN), %d of them split into %d partitions (%d units) spread over "+
			"the worker processes by leases (TTL %s, renewal %s), the others consumed from a queue each by all the workers; "+
			"%d writers append %d events/s (1–%d per append, more while behind the rate); "+
			"the workers scale %d → %d (one after the other), then 2 are SIGKILLed, 3 of the %d left stopped with SIGTERM and 1 of the %d left SIGKILLed, "+
			"leaving %d; each step is held until the leases of every projection converge",
			fleetProjections, fleetSplit, fleetPartitions, fleetSplit*fleetPartitions, lease.TTLDefault, lease.RenewDefault,
			fleetWriters, fleetRate, fleetPerAppend, fleetWorkers/2, fleetWorkers, fleetWorkers-2, fleetWorkers-5, fleetWorkers-6),
		checks: fmt.Sprintf("every step converges (joins and graceful stops within %s, SIGKILLs within %s); a monitor polling the lease "+
			"table every %s finds no partition of any projection without a live owner for longer than TTL + renewal + 1 s = %s, and every "+
			"partition owned again within that bound after each SIGKILL; every event in each of the %d read models exactly once, with the "+
			"store's content, in stream order",
			fleetJoinBound, fleetKillBound, leaseMonitorPoll, scaleUnownedBound, fleetProjections),
		settings: scenarioSettings{safetyNet: safetyNetDefault, partitions: fleetPartitions, exactOnly: true, fleet: fleetProjections, fleetSplit: fleetSplit,
			workers: fleetWorkers, writers: fleetWriters, rate: fleetRate, perAppend: fleetPerAppend, keepRate: true, relayInterval: fleetRelayInterval,
			// 3,250 queues: the suite's own node, whose limit of open files (rabbitcluster's
			// default) fits them; a broker started with 1,024 runs out and stops answering.
			// Quorum queues: a classic durable queue writes and syncs an index of its own, and
			// 3,250 of them live saturate the broker's pool of file workers (see RELIABILITY.md).
			privateBroker: true, slowHandshakes: true, queueType: amqpchannel.QueueQuorum},
		run: runFleet,
	}
}

func runFleet(ctx context.Context, e *env, r *result) error {
	s := &scaleRun{e: e, r: r, joinBound: fleetJoinBound, killBound: fleetKillBound, readyBound: fleetReadyBound, oneByOne: true}
	s.mon = newLeaseMonitor(e.pool, e.settings.splitNames(), fleetPartitions, e.workers.liveOwners, e.log)
	monCtx, stopMonitor := context.WithCancel(ctx)
	var monitoring sync.WaitGroup
	monitoring.Go(func() { s.mon.run(monCtx) })
	defer func() { stopMonitor(); monitoring.Wait() }()

	started := time.Now()
	if err := s.join(ctx, fleetWorkers/2); err != nil {
		return err
	}
	loadStarted := time.Now()
	e.scaleStart = loadStarted
	e.load.start(ctx)
	s.mon.arm()
	s.measureDB(ctx, fmt.Sprintf("database with %d workers", fleetWorkers/2), 10*time.Second)
	if err := s.join(ctx, fleetWorkers); err != nil {
		return err
	}
	s.measureDB(ctx, fmt.Sprintf("database with %d workers", fleetWorkers), 10*time.Second)
	return s.faultsThenVerdict(ctx, func() { stopMonitor(); monitoring.Wait() },
		fmt.Sprintf("workers %d → %d → %d → %d → %d", fleetWorkers/2, fleetWorkers, fleetWorkers-2, fleetWorkers-5, fleetWorkers-6),
		fleetRate, started, loadStarted)
}

// dbCounters are cumulative counters of the scenario's database: commits, and rows written
// to the lease tables (the members' heartbeats and renewals).
type dbCounters struct {
	at          time.Time
	commits     int64
	leaseWrites int64
}

// readCounters reads the database's counters (pg_stat_database, pg_stat_user_tables).
func (e *env) readCounters(ctx context.Context) (dbCounters, error) {
	c := dbCounters{at: time.Now()}
	err := e.pool.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		(SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables WHERE relname = ANY($1))`,
		lease.Tables()).Scan(&c.commits, &c.leaseWrites)
	return c, err
}

// measureDB notes the commits and lease-table writes per second over window.
func (s *scaleRun) measureDB(ctx context.Context, what string, window time.Duration) {
	before, err := s.e.readCounters(ctx)
	if err == nil {
		err = backoff.Sleep(ctx, window)
	}
	var after dbCounters
	if err == nil {
		after, err = s.e.readCounters(ctx)
	}
	if err != nil {
		s.r.Notes = append(s.r.Notes, fmt.Sprintf("%s: database counters unreadable: %v", what, err))
		return
	}
	secs := after.at.Sub(before.at).Seconds()
	s.note(before.at, "%s: %.0f commits/s, %.0f lease-table rows written/s (over %s)", what,
		float64(after.commits-before.commits)/secs, float64(after.leaseWrites-before.leaseWrites)/secs, window)
}
