package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/pgmigrate"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
)

// Leases spreads the partitions of partitioned projections (projection.Config.Partitions) over
// the workers that run them, with leases in PostgreSQL (package lease): every worker is a
// member of each such projection's group and owns its fair share of the partitions; a worker
// that joins or leaves (or dies) makes the others rebalance within a renewal or two (within
// TTL + Renew after a death).
type Leases struct {
	// DB holds the lease tables (postgres.Migrate, component projections). Required.
	DB postgres.DB
	// Schema of the lease tables ("" for the search_path).
	Schema string
	// Owner names this worker among the group's members; unique per process. Defaults to the
	// host name, the process id and a random suffix.
	Owner string
	// TTL and Renew: see lease.Config. Default to lease.TTLDefault and lease.RenewDefault.
	TTL, Renew time.Duration
}

// partitionSet is what a worker runs of one partitioned projection: the partitions it owns,
// each with the subscription of its unit.
type partitionSet struct {
	name  string
	units []string
	// leases configures the membership (nil: this worker owns every partition); member is
	// set once Run has joined the group.
	leases *lease.Config
	member atomic.Pointer[lease.Member]

	mu   sync.Mutex
	runs map[int]*partitionRun
	// subsMu guards subs apart from mu: a partition's run makes its subscriber (again, after a
	// subscription failed) while syncPartitions may hold mu, waiting for a run to end.
	subsMu sync.Mutex
	subs   map[int]unitSubscription // made at a gain (again after a failure), closed when the worker stops
}

// unitSubscription is a partition unit's subscriber and the topic it consumes.
type unitSubscription struct {
	sub   message.Subscriber
	topic string
}

// partitionRun is one owned partition's consumption of its unit's subscription.
type partitionRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// newPartitionSet returns the set of p (partitioned), with a lease member when leases is set.
func (w *Worker) newPartitionSet(p *projection.Projection, leases *Leases) (*partitionSet, error) {
	units, err := w.cfg.Runner.Partitions(p.Name())
	if err != nil {
		return nil, err
	}
	ps := &partitionSet{name: p.Name(), units: units, subs: map[int]unitSubscription{}, runs: map[int]*partitionRun{}}
	if leases != nil {
		cfg := lease.Config{Group: p.Name(), Partitions: len(units), Owner: leases.Owner, TTL: leases.TTL,
			Renew: leases.Renew, Schema: leases.Schema, Logger: w.logger.With(slog.String("projection", p.Name()))}.WithDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%w: Leases: %w", ErrInvalidConfig, err)
		}
		ps.leases = &cfg
	}
	return ps, nil
}

// owned returns the partitions the worker owns (every one without leases).
func (ps *partitionSet) owned() []int {
	if ps.leases == nil {
		out := make([]int, len(ps.units))
		for k := range out {
			out[k] = k
		}
		return out
	}
	if m := ps.member.Load(); m != nil {
		return m.Owned()
	}
	return nil
}

// guard returns the batch guard of partition k for a catch-up under ctx: a slot of the
// worker's MaxConcurrentPartitions, if set (waited for), then the partition's lease, if leased.
func (w *Worker) guard(ctx context.Context, ps *partitionSet, k int) projection.BatchGuard {
	if ps.leases == nil && w.slots == nil {
		return nil
	}
	return func() (func(), bool) {
		freeSlot := func() {}
		if w.slots != nil {
			select {
			case w.slots <- struct{}{}:
				freeSlot = func() { <-w.slots }
			case <-ctx.Done():
				return nil, false
			}
		}
		if ps.leases == nil {
			return freeSlot, true
		}
		if m := ps.member.Load(); m != nil {
			if done, ok := m.Use(k); ok {
				return func() { done(); freeSlot() }, true
			}
		}
		freeSlot()
		return nil, false
	}
}

// Owned returns the partitions of the named projection this worker owns now, in order: every
// partition of a partitioned projection when Config.Leases is nil, those it holds leases on
// otherwise; [0] for an unpartitioned projection it runs, nil for one it does not run.
func (w *Worker) Owned(name string) []int {
	if ps, ok := w.parts[name]; ok {
		return ps.owned()
	}
	if slices.Contains(w.names, name) {
		return []int{0}
	}
	return nil
}

// checkLeases reads the partition leases of each partitioned projection once, so that a
// worker whose lease tables are missing (Leases.Schema not migrated) fails to start instead of
// running without partitions: errors match projection.ErrNotMigrated then.
func (w *Worker) checkLeases(ctx context.Context) error {
	if w.cfg.Leases == nil {
		return nil
	}
	for _, name := range w.names {
		ps, ok := w.parts[name]
		if !ok {
			continue
		}
		if _, err := lease.Leases(ctx, w.cfg.Leases.DB, w.cfg.Leases.Schema, name, len(ps.units)); err != nil {
			if pgmigrate.Missing(err, w.cfg.Leases.Schema, lease.Tables()...) {
				err = fmt.Errorf("%w: %w", projection.ErrNotMigrated, err)
			}
			return fmt.Errorf("worker: partition leases of %s: %w", name, err)
		}
	}
	return nil
}

// subscriptionNames returns the names the worker declares on the channel: each projection's,
// and each partition unit's of the partitioned ones.
func (w *Worker) subscriptionNames() []string {
	out := slices.Clone(w.names)
	for _, name := range w.names {
		if ps, ok := w.parts[name]; ok {
			out = append(out, ps.units...)
		}
	}
	return out
}

// declare declares the worker's subscriptions: the projections' and their partition units'.
// A channel that routes by partition (channel.PartitionDeclarer) declares each partitioned
// projection's units with their partitions, so each receives only its partition's triggers.
func (w *Worker) declare(ctx context.Context) error {
	pd, ok := w.cfg.Channel.(channel.PartitionDeclarer)
	if !ok {
		if err := w.cfg.Channel.Declare(ctx, w.subscriptionNames()...); err != nil {
			return fmt.Errorf("worker: declare subscriptions: %w", err)
		}
		return nil
	}
	if err := w.cfg.Channel.Declare(ctx, w.names...); err != nil {
		return fmt.Errorf("worker: declare subscriptions: %w", err)
	}
	for _, name := range w.names {
		if ps, ok := w.parts[name]; ok {
			if err := pd.DeclarePartitions(ctx, ps.units...); err != nil {
				return fmt.Errorf("worker: declare the partitions of %s: %w", name, err)
			}
		}
	}
	return nil
}

// runPartitions runs the partitioned projections' partitions until ctx ends: each one's lease
// membership, and a consumer of each owned partition's subscription. When it returns, every
// partition consumer has stopped and every lease has been given back (or ctx's grace is over).
func (w *Worker) runPartitions(ctx context.Context) {
	if len(w.parts) == 0 {
		return
	}
	var membership sync.WaitGroup
	if w.cfg.Leases != nil {
		db, closeDB := w.leaseDB(ctx)
		defer closeDB()
		set, err := w.joinGroups(db)
		if err != nil { // the configs were checked in New
			w.logger.ErrorContext(ctx, "partition leases", slog.Any("error", err))
			return
		}
		if set != nil {
			defer membership.Wait()
			membership.Go(func() {
				if err := set.Run(ctx); err != nil && !errors.Is(err, lease.ErrClosed) && ctx.Err() == nil {
					w.logger.ErrorContext(ctx, "partition leases stopped", slog.Any("error", err))
				}
			})
		}
	}
	var wg sync.WaitGroup
	for _, name := range w.names {
		if ps, ok := w.parts[name]; ok {
			wg.Go(func() { w.runPartitionSet(ctx, ps) })
		}
	}
	wg.Wait()
}

// joinGroups makes the lease members of the leased partitioned projections, one set on db: a
// round every Renew renews, gives back and claims in all of them in one transaction, so the
// worker's lease traffic and its takeover after another worker's death do not grow with the
// number of projections. Nil when none is leased.
func (w *Worker) joinGroups(db postgres.DB) (*lease.Set, error) {
	var (
		cfgs []lease.Config
		sets []*partitionSet
	)
	for _, name := range w.names {
		if ps, ok := w.parts[name]; ok && ps.leases != nil {
			cfgs, sets = append(cfgs, *ps.leases), append(sets, ps)
		}
	}
	if len(cfgs) == 0 {
		return nil, nil
	}
	set, members, err := lease.NewSet(db, cfgs...)
	if err != nil {
		return nil, err
	}
	for i, ps := range sets {
		ps.member.Store(members[i])
	}
	return set, nil
}

// leaseDB returns the database handle of the lease rounds and its close function. Given a
// pool (Leases.DB is a *pgxpool.Pool), it is a pool of its own (leasePoolConns connections),
// with the same settings: renewals must never wait for a connection behind the partitions'
// batches, which would let the leases lapse while their owner works (16 partitions' batches on
// a pool of 4 did). Otherwise Leases.DB itself.
func (w *Worker) leaseDB(ctx context.Context) (postgres.DB, func()) {
	pool, ok := w.cfg.Leases.DB.(interface{ Config() *pgxpool.Config })
	if !ok {
		return w.cfg.Leases.DB, func() {}
	}
	cfg := pool.Config()
	cfg.MaxConns, cfg.MinConns = leasePoolConns, 0
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		w.logger.WarnContext(ctx, "partition leases: no pool of their own; renewing on Leases.DB", slog.Any("error", err))
		return w.cfg.Leases.DB, func() {}
	}
	return own, own.Close
}

// leasePoolConns is the size of the lease rounds' own pool: one connection for the rounds
// (one transaction for every group) and one for a projection's Close (leaving its group)
// while a round runs.
const leasePoolConns = 2

// runPartitionSet runs ps until ctx ends: a consumer per owned partition, started and stopped
// as its lease membership's ownership changes (every partition when not leased); then it stops
// the consumers, gives the leases back and closes the partitions' subscribers.
func (w *Worker) runPartitionSet(ctx context.Context, ps *partitionSet) {
	log := w.logger.With(slog.String("projection", ps.name))
	member := ps.member.Load()
	for {
		var changed <-chan struct{}
		if member != nil {
			changed = member.Changed()
		}
		w.syncPartitions(ctx, ps, log)
		select {
		case <-ctx.Done():
		case <-changed:
			continue
		}
		break
	}
	// Stop consuming (every partition at once: a partition's run may wait for the broker, its
	// subscription still opening), then give the leases back at once (not after TTL) so the
	// other workers take the partitions over at their next round.
	ps.mu.Lock()
	runs := ps.runs
	ps.runs = map[int]*partitionRun{}
	ps.mu.Unlock()
	for _, r := range runs {
		r.cancel()
	}
	for _, r := range runs {
		<-r.done
		w.stats[ps.name].givenBack.Add(1)
	}
	if member != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.CloseTimeout)
		if err := member.Close(closeCtx); err != nil {
			log.WarnContext(ctx, "could not give the partition leases back; they lapse after their TTL", slog.Any("error", err))
		}
		cancel()
	}
	// Close the subscribers together: each close is a round trip to the broker (an AMQP
	// channel's), and a worker of fifty projections may own hundreds of partitions; one at a
	// time, 300 of them on a loaded broker outlasted a 10 s stop.
	ps.subsMu.Lock()
	defer ps.subsMu.Unlock()
	var closing sync.WaitGroup
	for k, s := range ps.subs {
		closing.Go(func() {
			if err := s.sub.Close(); err != nil {
				log.WarnContext(ctx, "closing a partition's subscriber failed", slog.String("unit", ps.units[k]), slog.Any("error", err))
			}
		})
	}
	closing.Wait()
}

// syncPartitions starts a consumer for each newly owned partition and stops those of the
// partitions no longer owned (given back only between batches, see lease.Member.Use).
func (w *Worker) syncPartitions(ctx context.Context, ps *partitionSet, log *slog.Logger) {
	owned := ps.owned()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, r := range ps.runs {
		if !slices.Contains(owned, k) {
			r.cancel()
			<-r.done
			delete(ps.runs, k)
			w.stats[ps.name].givenBack.Add(1)
			log.InfoContext(ctx, "partition given back", slog.String("unit", ps.units[k]))
		}
	}
	for _, k := range owned {
		if _, ok := ps.runs[k]; ok || ctx.Err() != nil {
			continue
		}
		runCtx, cancel := context.WithCancel(ctx)
		r := &partitionRun{cancel: cancel, done: make(chan struct{})}
		ps.runs[k] = r
		w.stats[ps.name].claimed.Add(1)
		go func() {
			defer close(r.done)
			w.runPartition(runCtx, ps, k)
		}()
	}
}

// subscriber returns (making it at the first call, or after dropSubscriber) the subscriber of
// partition k's unit.
func (ps *partitionSet) subscriber(w *Worker, k int) (unitSubscription, error) {
	ps.subsMu.Lock()
	defer ps.subsMu.Unlock()
	if s, ok := ps.subs[k]; ok {
		return s, nil
	}
	sub, topic, err := w.cfg.Channel.Subscriber(ps.units[k])
	if err != nil {
		return unitSubscription{}, err
	}
	ps.subs[k] = unitSubscription{sub: sub, topic: topic}
	return ps.subs[k], nil
}

// dropSubscriber closes partition k's subscriber s, whose subscription failed or ended, so
// that the next subscriber call makes a new one.
func (ps *partitionSet) dropSubscriber(k int, s unitSubscription, log *slog.Logger) {
	ps.subsMu.Lock()
	if cur, ok := ps.subs[k]; ok && cur.sub == s.sub {
		delete(ps.subs, k)
	}
	ps.subsMu.Unlock()
	if err := s.sub.Close(); err != nil {
		log.Warn("closing a partition's failed subscriber failed", slog.Any("error", err))
	}
}

// partitionResubscribe spaces out a partition's attempts to subscribe again after its
// subscriber could not be made, its subscription was refused, or its subscription ended while
// the partition was still owned.
var partitionResubscribe = backoff.Exponential{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}

// runPartition consumes partition k's triggers while the worker owns it (until ctx ends). A
// subscriber that cannot be made, a subscription the broker refuses, and a subscription that
// ends while the partition is still owned (its connection lost under it) are tried again, with
// backoff, on a new subscriber: the partition stays owned meanwhile (its lease keeps the other
// workers off it), and each new subscription catches the partition up first, so nothing
// appended meanwhile waits for the safety net.
func (w *Worker) runPartition(ctx context.Context, ps *partitionSet, k int) {
	log := w.logger.With(slog.String("projection", ps.name), slog.String("unit", ps.units[k]))
	wait := partitionResubscribe
	for {
		s, err := ps.subscriber(w, k)
		if err == nil {
			var subscribed bool
			subscribed, err = w.consumePartition(ctx, ps, k, s, log)
			if ctx.Err() != nil {
				return
			}
			ps.dropSubscriber(k, s, log)
			if subscribed {
				wait.Reset()
				err = errSubscriptionEnded
			}
		}
		if ctx.Err() != nil {
			return
		}
		pause := wait.Next()
		log.ErrorContext(ctx, "the partition's triggers are not consumed; subscribing again", slog.Duration("in", pause), slog.Any("error", err))
		if backoff.Sleep(ctx, pause) != nil {
			return
		}
	}
}

// errSubscriptionEnded reports a partition's subscription that ended while the worker still
// owned the partition.
var errSubscriptionEnded = errors.New("the subscription ended while the partition is owned")

// consumePartition subscribes to partition k's triggers with s, catches the partition up once
// (the events appended before the subscription, and while no worker owned it), then handles
// each trigger as a projection's handler does — retries, dead letters (recorded under the
// unit's name) and all — until the subscription ends. It reports whether it subscribed.
func (w *Worker) consumePartition(ctx context.Context, ps *partitionSet, k int, s unitSubscription, log *slog.Logger) (bool, error) {
	msgs, err := s.sub.Subscribe(ctx, s.topic)
	if err != nil {
		return false, err
	}
	log.InfoContext(ctx, "partition claimed: consuming its triggers")
	h := w.unitHandler(ps, k, log)
	var claimed sync.WaitGroup
	claimed.Go(func() { w.catchUpClaimed(ctx, h, log) })
	w.consumeUnit(ctx, ps.units[k], msgs, h, log)
	claimed.Wait()
	return true, nil
}

// catchUpClaimed catches a partition up once it is claimed: what was appended while no worker
// owned it has no trigger on its way. A catch-up that fails on anything but a handler (an outage,
// a batch timeout) is tried again with backoff until it succeeds or the partition is given up; a
// handler's failure is the triggers' to retry and dead-letter, as for any projection.
func (w *Worker) catchUpClaimed(ctx context.Context, h *projectionHandler, log *slog.Logger) {
	wait := backoff.Exponential{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	for {
		err := w.catchUp(ctx, h)
		if err == nil || ctx.Err() != nil || errors.Is(err, projection.ErrHandler) || errors.Is(err, projection.ErrCrashLoop) {
			return
		}
		pause := wait.Next()
		log.WarnContext(ctx, "catch-up of a claimed partition failed; trying again", slog.Duration("in", pause), slog.Any("error", err))
		if backoff.Sleep(ctx, pause) != nil {
			return
		}
	}
}

// consumeUnit handles the unit's messages one at a time through the handler-level middleware
// AddHandlers gives a projection's handler (dead letters, retries, panic recovery), acking
// those it handled and nacking the others, until the subscription ends.
func (w *Worker) consumeUnit(ctx context.Context, unit string, msgs <-chan *message.Message, h *projectionHandler, log *slog.Logger) {
	mw, err := w.middleware(unit)
	if err != nil {
		log.ErrorContext(ctx, "partition handler middleware", slog.Any("error", err))
		return
	}
	handle := message.HandlerFunc(func(msg *message.Message) ([]*message.Message, error) { return nil, h.handle(msg) })
	for i := len(mw) - 1; i >= 0; i-- {
		handle = mw[i](handle)
	}
	for msg := range msgs {
		if _, err := handle(msg); err != nil {
			msg.Nack()
			continue
		}
		msg.Ack()
	}
}

// unitHandler returns the trigger handler of partition k of ps: a projection handler whose
// catch-ups run that partition alone, batch by batch under its lease.
func (w *Worker) unitHandler(ps *partitionSet, k int, log *slog.Logger) *projectionHandler {
	p, _ := w.cfg.Runner.Projection(ps.name) // checked in New
	return &projectionHandler{w: w, name: ps.units[k], types: p.Types(), c: w.stats[ps.name], log: log,
		partition: eventstore.Partition{Index: k, Count: len(ps.units)},
		run: func(ctx context.Context) (projection.Result, error) {
			var opts []projection.CatchUpOption
			if guard := w.guard(ctx, ps, k); guard != nil {
				opts = append(opts, projection.WithBatchGuard(guard))
			}
			return w.cfg.Runner.CatchUpPartition(ctx, ps.name, k, opts...)
		}}
}

// catchUpOwned catches up, for the safety net, the partitions of ps the worker owns, one
// after the other, each under its lease.
func (w *Worker) catchUpOwned(ctx context.Context, ps *partitionSet, log *slog.Logger) error {
	var errs []error
	for _, k := range ps.owned() {
		if err := w.catchUp(ctx, w.unitHandler(ps, k, log)); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// nudgePartitions publishes a trigger to every partition of the named projection, so their
// owners (wherever they run) catch up: after an operator's request on the projection (skip,
// rebuild, replay, redrive, or a trigger addressed to it) handled by this worker.
func (w *Worker) nudgePartitions(ctx context.Context, ps *partitionSet) error {
	now := time.Now()
	for _, unit := range ps.units {
		if err := w.cfg.Channel.Publish(ctx, trigger.Trigger{Reason: trigger.ReasonAppend, Projection: unit, At: now}); err != nil {
			return fmt.Errorf("projection %s: trigger partition %s: %w", ps.name, unit, err)
		}
	}
	return nil
}

// middleware returns the handler-level middleware of the named subscription: dead-lettering
// outermost, then retries with backoff, then panic recovery.
func (w *Worker) middleware(name string) ([]message.HandlerMiddleware, error) {
	mw, err := retry.Middleware(retry.Config{
		Policy:               w.cfg.Retry,
		DeadLetterFunc:       func(msg *message.Message, err error) error { return w.deadLetter(name, msg, err) },
		ShouldDeadLetterFunc: shouldDeadLetter,
		Logger:               w.logger.With(slog.String("projection", name)),
	})
	if err != nil {
		return nil, fmt.Errorf("worker: middleware of %s: %w", name, err)
	}
	return mw, nil
}
