package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/rabbitcluster"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// suite is what every scenario of a run shares.
type suite struct {
	cluster    *pgcluster.Cluster
	broker     *broker
	rabbit     *rabbitcluster.Node // the private RabbitMQ node, nil unless broker-restart runs
	workerBin  string
	relayBin   string
	cliBin     string
	logDir     string // chaos-results/logs
	runID      string
	pgPassword string // the private cluster's password (scram-sha-256), in every PostgreSQL URL
	seed       uint64
	rate       int
	verbose    bool
	log        *slog.Logger
}

// progress prints a line about the run's progress to stderr with -v.
func (s *suite) progress(scenario, format string, args ...any) {
	if s.verbose {
		fmt.Fprintf(os.Stderr, "  %-17s %s\n", scenario, fmt.Sprintf(format, args...))
	}
}

// env is one scenario's world: a database of its own on the private cluster, RabbitMQ names
// under a prefix of its own, the writers and the relay in this process, and worker processes.
type env struct {
	s       *suite
	name    string
	broker  *broker // the shared broker, or the private node in broker-restart
	log     *slog.Logger
	dbName  string
	dbURL   string
	prefix  string
	pool    *pgxpool.Pool
	store   *espg.Store
	backend *pgproj.Backend
	dead    *dlpostgres.Store
	models  *chaosmodel.Models
	// next is version 2 of the exactly-once projection in the rebuild scenarios, nil elsewhere.
	next   *chaosmodel.Models
	status *projection.Runner // the projections' definitions, for Status only: it never catches up
	// units are the projections' unit names (queues): chaosmodel.Names (or the exactly-once
	// projection alone), their partitions, and version 2 of the exactly-once projection and its
	// partitions in the rebuild scenarios.
	units []string
	// partitionUnits are the units of each partitioned projection, in partition order: they
	// are declared with DeclarePartitions (routed by partition).
	partitionUnits [][]string
	channel        *amqpchannel.Channel
	lossy          *lossyPublisher
	workers        *pool
	load           *load
	logDir         string
	sinkDir        string
	rng            *mrand.Rand

	settings scenarioSettings
	// verified is what verify read, for the scenarios' own checks.
	verified verified

	// Set by the scenarios for their own checks.
	poisonID          uuid.UUID            // poison: the poison event
	poisonAt, fixedAt time.Time            // poison: when it was appended, when it was fixed
	malformed         map[string]malformed // malformed-input: "<projection>/<message uuid>" → what was sent
	secrets           []string             // security: passwords that must appear nowhere
	droppedBefore     int64                // dropped-triggers: triggers dropped before all were
	relayDown         time.Duration        // relay-kill: the relay's longest absence, kill to ready
	scaleStart        time.Time            // scale: when the writers started

	relayCancel context.CancelFunc
	relayDone   chan struct{}
	// relayProc is the relay process when the scenario runs it apart (externalRelay).
	relayProc *workerSlot

	// faultEnd is when the last fault ended (faultsOver); zero if never.
	faultEnd time.Time
}

// verified is the appended events (id → recorded time) and what each read model holds.
type verified struct {
	appended map[uuid.UUID]time.Time
	seen     map[string]map[uuid.UUID]sighting
}

// scenarioSettings are a scenario's knobs for its environment.
type scenarioSettings struct {
	safetyNet time.Duration
	// outage marks the scenarios whose faults are outages (a database or broker away, cut
	// connections): they must leave no dead letter.
	outage bool
	// privateBroker runs the scenario on the suite's own RabbitMQ node instead of the shared
	// broker.
	privateBroker bool
	// slowHandshakes gives the clients' AMQP handshakes brokerHandshakeTimeout (the private
	// node's own): scale-fleet's node, with thousands of queues on a loaded machine, took
	// longer than the default 10 s to answer a joining worker's, again and again.
	slowHandshakes bool
	// queueType is the kind of the scenario's RabbitMQ queues (channel/amqp Config.QueueType,
	// chaosworker -queue-type); "" is the channel's default.
	queueType amqpchannel.QueueType
	// externalRelay runs the relay in a process of its own (chaosrelay) instead of in the
	// suite's process.
	externalRelay bool
	// park runs the exactly-once projection with OnFailure park.
	park bool
	// rebuild runs the exactly-once projection as a versioned one, at version 1 in every
	// worker to begin with, and registers its version 2 (building) beside it; flipHold is how
	// long version 2's cut-over waits in its ActivateFunc.
	rebuild  bool
	flipHold time.Duration
	// buildLagTarget paces version 2's build (chaosworker -build-lag-target; 0: the default).
	buildLagTarget time.Duration
	// partitions splits the exactly-once projection into that many partitions, which the
	// workers spread with leases (chaosworker -partitions); with rebuild, version 1 of it, and
	// nextPartitions version 2 (0 or 1: unpartitioned). exactOnly runs (and verifies) the
	// exactly-once projection alone.
	partitions, nextPartitions int
	exactOnly                  bool
	// leaseTTL and leaseRenew replace the lease defaults of the workers (zero keeps them).
	leaseTTL, leaseRenew time.Duration
	// workers, writers, rate and perAppend replace the defaults: 2 worker processes, 4
	// writers, the run's -rate, 1 to perAppendDefault events per append.
	workers, writers, rate, perAppend int
	// keepRate makes the writers keep the rate when appends slow down (load.keepRate).
	keepRate bool
	// fleet, when above 1, runs that many exactly-once projections: chaos_exact and
	// chaosmodel.FleetProjection 1 to fleet-1 (with exactOnly), the first fleetSplit of them
	// (chaos_exact first) split into partitions, the others unpartitioned.
	fleet, fleetSplit int
	// relayInterval is the relay's MinInterval (its MaxInterval five times it); defaults to
	// 10 ms. A longer one coalesces more appends into each trigger.
	relayInterval time.Duration
}

// partitionsOf is how many partitions version version of the exactly-once projection has
// (version 2 is rebuild's new version; 0 or 1: unpartitioned).
func (set scenarioSettings) partitionsOf(version int) int {
	if version >= 2 {
		return set.nextPartitions
	}
	return set.partitions
}

// splitNames are the models split into partitions: the lease groups (with fleet, the first
// fleetSplit of modelNames; otherwise the exactly-once projection when partitioned).
func (set scenarioSettings) splitNames() []string {
	if set.partitions <= 1 {
		return nil
	}
	names := set.modelNames()
	if set.fleet > 1 {
		return names[:min(len(names), max(1, set.fleetSplit))]
	}
	return names[:1]
}

// modelNames are the read models the scenario's workers run and verify compares, in the order
// of the results.
func (set scenarioSettings) modelNames() []string {
	if set.exactOnly {
		names := []string{chaosmodel.ExactProjection}
		for i := 1; i < set.fleet; i++ {
			names = append(names, chaosmodel.FleetProjection(i))
		}
		return names
	}
	return []string{chaosmodel.ExactProjection, chaosmodel.IdempotentProjection, chaosmodel.FileProjection}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newEnv creates the scenario's database, schema, channel and relay. The workers are created
// but not started: scenarios start them when they want (after a backlog, say).
func (s *suite) newEnv(ctx context.Context, name string, set scenarioSettings) (_ *env, err error) {
	dbName := "chaos_" + strings.ReplaceAll(name, "-", "_")
	e := &env{
		s: s, name: name, log: s.log.With(slog.String("scenario", name)),
		dbName:   dbName,
		dbURL:    s.cluster.URL(dbName, s.pgPassword),
		prefix:   fmt.Sprintf("nudge_chaos.%s.%s.", s.runID, name),
		logDir:   filepath.Join(s.logDir, name),
		rng:      mrand.New(mrand.NewPCG(s.seed, hashName(name))),
		settings: set,
		broker:   s.broker,
	}
	if set.privateBroker {
		e.broker = &broker{url: s.rabbit.URL()}
		if set.slowHandshakes {
			e.broker.url += fmt.Sprintf("?connection_timeout=%d", brokerHandshakeTimeout.Milliseconds())
		}
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	e.sinkDir = filepath.Join(e.logDir, "sink")
	if err := os.MkdirAll(e.sinkDir, 0o755); err != nil {
		return nil, err
	}
	admin, err := pgx.Connect(ctx, s.cluster.URL("postgres", s.pgPassword))
	if err != nil {
		return nil, fmt.Errorf("connect to the private cluster: %w", err)
	}
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)")
	if err == nil {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize())
	}
	_ = admin.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("create database %s: %w", dbName, err)
	}
	cfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if e.store, err = espg.New(e.pool, espg.Config{}); err != nil {
		return nil, err
	}
	if e.backend, err = pgproj.New(e.store); err != nil {
		return nil, err
	}
	if e.dead, err = dlpostgres.New(e.pool, dlpostgres.Config{}); err != nil {
		return nil, err
	}
	for _, m := range []func(context.Context) error{e.store.Migrate, e.backend.Migrate, e.dead.Migrate} {
		if err := m(ctx); err != nil {
			return nil, err
		}
	}
	if err := e.newStatusRunner(); err != nil {
		return nil, err
	}
	// Created here once, so the workers' Init finds the tables (concurrent CREATE TABLE IF NOT
	// EXISTS can fail in PostgreSQL).
	if err := e.status.Init(ctx); err != nil {
		return nil, err
	}
	e.channel, err = amqpchannel.New(ctx, amqpchannel.Config{URL: e.broker.url, Prefix: e.prefix, ConnectionName: e.prefix + "publisher",
		Logger: e.log, StartupTimeout: 10 * time.Second, QueueType: set.queueType})
	if err != nil {
		return nil, err
	}
	if err := e.declare(ctx); err != nil {
		return nil, err
	}
	e.lossy = &lossyPublisher{inner: e.channel, rng: mrand.New(mrand.NewPCG(s.seed, 7))}
	if set.externalRelay {
		e.relayProc = &workerSlot{name: "relay", set: workerSettings{binary: s.relayBin, dbURL: e.dbURL, amqpURL: e.broker.url,
			prefix: e.prefix, logDir: e.logDir, relay: true}}
	} else if err := e.startRelay(ctx); err != nil {
		return nil, err
	}
	ws := workerSettings{binary: s.workerBin, dbURL: e.dbURL, amqpURL: e.broker.url, prefix: e.prefix,
		sinkDir: e.sinkDir, logDir: e.logDir, safetyNet: set.safetyNet, park: set.park, flipHold: set.flipHold, buildLagTarget: set.buildLagTarget, partitions: set.partitions,
		leaseTTL: set.leaseTTL, leaseRenew: set.leaseRenew, fleet: max(0, set.fleet-1), fleetSplit: set.fleetSplit - 1, queueType: set.queueType}
	if set.fleet > 1 {
		// A broker busy with thousands of channels may take a while to accept a connection:
		// with 15 workers on a loaded machine, a sixteenth's handshakes timed out for a minute.
		// Its retries may take most of the worker's ready bound (fleetReadyBound).
		ws.startup = deadline(3 * time.Minute)
	}
	if set.exactOnly {
		ws.projections = chaosmodel.ExactProjection
	}
	e.workers = newPool(ws, cmp.Or(set.workers, 2))
	if set.rebuild {
		for _, slot := range e.workers.slots {
			slot.deploy(1, set.partitionsOf(1))
		}
	}
	e.load = newLoad(e.store, e.log, cmp.Or(set.writers, 4), cmp.Or(set.rate, s.rate), set.perAppend, s.seed^hashName(name))
	e.load.keepRate = set.keepRate
	return e, nil
}

// newStatusRunner defines the projections (with version 2 of the exactly-once one in the
// rebuild scenarios) in a runner that only reads their status. Its models never handle an event:
// their file sinks stay empty.
func (e *env) newStatusRunner() error {
	cfg := chaosmodel.Config{DB: e.pool, SinkPath: filepath.Join(e.logDir, "status-only.sink"), Partitions: e.settings.partitions,
		Fleet: max(0, e.settings.fleet-1), FleetPartitioned: e.settings.fleetSplit - 1}
	if e.settings.rebuild {
		cfg.ExactVersion = 1
	}
	var err error
	if e.models, err = chaosmodel.New(cfg); err != nil {
		return err
	}
	var projections []*projection.Projection
	for _, p := range e.models.Projections {
		if slices.Contains(e.settings.modelNames(), p.Name()) {
			projections = append(projections, p)
			e.units = append(e.units, p.Name())
			if p.Partitioned() {
				var units []string
				for _, u := range p.Units() {
					units = append(units, u.Name()) // the partitions' own queues
				}
				e.units = append(e.units, units...)
				e.partitionUnits = append(e.partitionUnits, units)
			}
		}
	}
	if e.settings.rebuild {
		cfg.ExactVersion, cfg.Partitions, cfg.SinkPath = 2, e.settings.partitionsOf(2), filepath.Join(e.logDir, "status-only-v2.sink")
		if e.next, err = chaosmodel.New(cfg); err != nil {
			return err
		}
		next := e.next.Projections[0]
		projections = append(projections, next)
		e.units = append(e.units, next.Name())
		if next.Partitioned() {
			var units []string
			for _, u := range next.Units() {
				units = append(units, u.Name())
			}
			e.units = append(e.units, units...)
			e.partitionUnits = append(e.partitionUnits, units)
		}
	}
	e.status, err = projection.NewRunner(e.backend, projection.RunnerConfig{Logger: e.log}, projections...)
	return err
}

// declare declares every unit's queue, the partition units' with DeclarePartitions.
func (e *env) declare(ctx context.Context) error {
	partition := map[string]bool{}
	for _, units := range e.partitionUnits {
		if err := e.channel.DeclarePartitions(ctx, units...); err != nil {
			return err
		}
		for _, u := range units {
			partition[u] = true
		}
	}
	var rest []string
	for _, u := range e.units {
		if !partition[u] {
			rest = append(rest, u)
		}
	}
	return e.channel.Declare(ctx, rest...)
}

// startRelay runs a relay in the suite's process, publishing through the lossy publisher.
func (e *env) startRelay(ctx context.Context) error {
	minInterval := cmp.Or(e.settings.relayInterval, 10*time.Millisecond)
	rel, err := relay.New(e.backend, e.lossy, relay.Config{Logger: e.log, MinInterval: minInterval, MaxInterval: 5 * minInterval})
	if err != nil {
		return err
	}
	relayCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.relayCancel, e.relayDone = cancel, make(chan struct{})
	go func() {
		defer close(e.relayDone)
		if err := rel.Run(relayCtx); err != nil {
			e.log.Error("relay stopped", slog.String("projection", relay.NameDefault), slog.Any("error", err))
		}
	}()
	return nil
}

// hashName turns a scenario name into a seed component.
func hashName(name string) uint64 {
	h := uint64(1469598103934665603)
	for i := range len(name) {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	return h
}

// close stops everything the environment started and deletes its RabbitMQ names. The
// database stays until the cluster is removed.
// It is safe on an environment whose set-up failed half-way.
func (e *env) close() {
	if e.load != nil {
		e.load.stopWriters()
	}
	if e.workers != nil {
		e.workers.stopAll()
	}
	if e.relayCancel != nil {
		e.relayCancel()
		<-e.relayDone
	}
	if e.relayProc != nil {
		e.relayProc.stop(10 * time.Second)
	}
	if e.channel != nil {
		_ = e.channel.Close()
		if err := e.broker.deleteTopology(e.prefix, e.units); err != nil {
			e.log.Warn("could not delete the scenario's queues", slog.Any("error", err))
		}
	}
	if e.models != nil {
		_ = e.models.Close()
	}
	if e.next != nil {
		_ = e.next.Close()
	}
	if e.pool != nil {
		e.pool.Close()
	}
}

// statuses returns every projection's status.
func (e *env) statuses(ctx context.Context) ([]projection.Status, error) {
	return e.status.Statuses(ctx)
}

// caughtUpTo reports whether every projection has handled every event up to pos: committed a
// position at or past it, or, for each partition of a partitioned projection, whose position
// stays at its own last event, no lag left against a head at or past pos.
func (e *env) caughtUpTo(ctx context.Context, pos eventstore.Position) bool {
	sts, err := e.statuses(ctx)
	if err != nil {
		return false
	}
	for _, st := range sts {
		if st.VersionState != projection.VersionRetired && !unitsCaughtUpTo(st, pos) {
			return false
		}
	}
	return true
}

// unitsCaughtUpTo reports whether the units of st (its partitions, or st itself) have handled
// every event up to pos.
func unitsCaughtUpTo(st projection.Status, pos eventstore.Position) bool {
	if len(st.Partitions) == 0 {
		return !st.Position.Less(pos)
	}
	for _, part := range st.Partitions {
		if part.Position.Less(pos) && (part.LagEvents > 0 || part.Head.Less(pos)) {
			return false
		}
	}
	return true
}

// faultsOver marks the end of the last fault, from which the time to recover is measured.
func (e *env) faultsOver() { e.faultEnd = time.Now() }

// recovery is the time to recover from the faults (see recoveryTime), measured on what
// verify read; -1 when a model misses an event it needs.
func (e *env) recovery() time.Duration {
	var models []map[uuid.UUID]sighting
	for _, name := range e.settings.modelNames() {
		models = append(models, e.verified.seen[name])
	}
	d, ok := recoveryTime(e.verified.appended, models, e.faultEnd)
	if !ok {
		return -1
	}
	return d
}

// waitCaughtUp waits until every projection has handled everything readable and fails no
// more, up to timeout.
func (e *env) waitCaughtUp(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last []projection.Status
	for {
		head, err := e.store.Head(ctx)
		if err == nil && e.caughtUpTo(ctx, head) {
			sts, err := e.statuses(ctx)
			if err == nil && allCaughtUp(sts) {
				return nil
			}
			last = sts
		}
		select {
		case <-ctx.Done():
			var desc []string
			for _, st := range last {
				desc = append(desc, fmt.Sprintf("%s: %s at %s, lag %d", st.Name, st.State, st.Position, st.LagEvents))
			}
			return fmt.Errorf("the projections did not catch up within %s (%s)", timeout, strings.Join(desc, "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allCaughtUp(sts []projection.Status) bool {
	for _, st := range sts {
		if k := st.Condition(); k != projection.ConditionCaughtUp && k != projection.ConditionRetired {
			return false
		}
	}
	return len(sts) > 0
}

// between returns a random duration in [lo, hi).
func (e *env) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(e.rng.Int64N(int64(hi-lo)))
}

// lossyPublisher stands between the relay and the channel and drops a share of the triggers,
// as a broker or network that loses messages would.
type lossyPublisher struct {
	inner   trigger.Publisher
	mu      sync.Mutex
	rng     *mrand.Rand
	rate    float64 // share dropped, 0 to 1
	dropped atomic.Int64
	sent    atomic.Int64
}

// setDropRate sets the share of triggers dropped from now on.
func (p *lossyPublisher) setDropRate(rate float64) {
	p.mu.Lock()
	p.rate = math.Min(math.Max(rate, 0), 1)
	p.mu.Unlock()
}

// Publish implements trigger.Publisher: it reports success for a dropped trigger, as a lossy
// network would.
func (p *lossyPublisher) Publish(ctx context.Context, t trigger.Trigger) error {
	p.mu.Lock()
	drop := p.rate > 0 && p.rng.Float64() < p.rate
	p.mu.Unlock()
	if drop {
		p.dropped.Add(1)
		return nil
	}
	if err := p.inner.Publish(ctx, t); err != nil {
		return err
	}
	p.sent.Add(1)
	return nil
}

// errBudget reports a scenario cut short by the run's time budget.
var errBudget = errors.New("the run's time budget ran out")
