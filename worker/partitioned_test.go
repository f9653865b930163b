package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// streamModel is a partitioned projection that records each event once per (stream, version)
// and refuses a version whose predecessor it has not applied: every stream in order, once.
// hold, when it returns a channel, blocks the event's handler until the channel closes.
func (s *setup) streamModel(t testing.TB, name string, partitions int, hold func(e eventstore.Event) <-chan struct{}) *projection.Projection {
	t.Helper()
	table := pgx.Identifier{name + "_streams"}.Sanitize()
	p, err := projection.New(name, projection.Config{
		Partitions: partitions,
		BatchSize:  20,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (stream text, version int, times int NOT NULL, PRIMARY KEY (stream, version))`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `DELETE FROM `+table)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if e.StreamID == poisonStream && poisoned.Load() {
			return errors.New("poison")
		}
		if hold != nil {
			if wait := hold(e.Event); wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		if e.StreamVersion > 1 {
			var ok bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+table+` WHERE stream = $1 AND version = $2)`, e.StreamID, e.StreamVersion-1).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("stream %s: version %d before %d", e.StreamID, e.StreamVersion, e.StreamVersion-1)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, $2, 1) ON CONFLICT (stream, version) DO UPDATE SET times = `+table+`.times + 1`,
			e.StreamID, e.StreamVersion)
		return err
	}))
	require.NoError(t, err)
	return p
}

// poisonStream's events fail streamModel's handler while poisoned is set.
const poisonStream = "s-007"

var poisoned atomic.Bool

// streamRows counts streamModel's rows and those applied more than once.
func (s *setup) streamRows(t testing.TB, name string) (rows, twice int) {
	t.Helper()
	table := pgx.Identifier{name + "_streams"}.Sanitize()
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM `+table).Scan(&rows, &twice))
	return rows, twice
}

// appendStreams appends one event to each of streams streams, numbered from first.
func (s *setup) appendStreams(t testing.TB, streams, first int) {
	t.Helper()
	for i := range streams {
		s.append(t, fmt.Sprintf("s-%03d", i), eventstore.EventData{Type: "A", Payload: []byte(fmt.Sprintf(`{"n":%d}`, first+i))})
	}
}

// streamsOf returns the names appendStreams gives the streams of partition k.
func (s *setup) streamsOf(streams, parts, k int) []string {
	var out []string
	for i := range streams {
		if id := fmt.Sprintf("s-%03d", i); eventstore.PartitionOf(id, parts) == k {
			out = append(out, id)
		}
	}
	return out
}

// leaseOwners returns the owner of each partition of the named projection ("" for none).
func (s *setup) leaseOwners(t testing.TB, name string, partitions int) []string {
	t.Helper()
	ls, err := lease.Leases(context.Background(), s.db.Pool, "", name, partitions)
	require.NoError(t, err)
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Owner
	}
	return out
}

// secondChannel returns a channel of ch's kind for a second worker, as another process would
// have: the same GoChannel (it lives in this process), a new connection otherwise. It closes
// when the test ends.
func (s *setup) secondChannel(t testing.TB, ch channel.Channel) channel.Channel {
	t.Helper()
	var (
		other channel.Channel
		err   error
	)
	switch ch.(type) {
	case *amqpchannel.Channel:
		other, err = amqpchannel.New(context.Background(), amqpchannel.Config{URL: s.amqp.URL, Prefix: s.amqp.Prefix,
			ConnectionName: s.amqp.ConnectionName + "-2", Logger: s.logger})
	case *pgchannel.Channel:
		other, err = pgchannel.New(s.db.NewPool(t, 24), pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: s.logger})
	default:
		return ch
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.Close()) })
	return other
}

// leased is the config of a worker called owner that shares partitions by leases on the
// test's database, renewed every 100 ms, without the safety net.
func (s *setup) leased(owner string) worker.Config {
	return worker.Config{Leases: &worker.Leases{DB: s.db.Pool, Owner: owner, TTL: 4 * time.Second, Renew: 100 * time.Millisecond},
		SafetyNetInterval: -1}
}

// TestPartitionsSpreadOverWorkers: a projection of 4 partitions runs on one worker (every
// partition its own), then on two (two each, disjoint, as the lease table says), then on one
// again after the other stops (its leases given back at once); on every channel, every
// stream's events are applied once and in order throughout.
func TestPartitionsSpreadOverWorkers(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		const name, parts, streams = "spread", 4, 40
		w1, stop1 := s.startStoppable(t, ch, s.leased("w1"), s.streamModel(t, name, parts, nil))
		t.Cleanup(func() { stop1(); require.NoError(t, ch.Close()) })
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition")
		s.appendStreams(t, streams, 0)
		require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == streams }, eventually, 10*time.Millisecond, "one worker applied the first round")

		w2, stop2 := s.startStoppable(t, s.secondChannel(t, ch), s.leased("w2"), s.streamModel(t, name, parts, nil))
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts/2 && len(w2.Owned(name)) == parts/2 }, eventually, 10*time.Millisecond, "two each")
		owners := s.leaseOwners(t, name, parts)
		require.ElementsMatch(t, []string{"w1", "w1", "w2", "w2"}, owners, "the lease table agrees")
		for _, k := range w1.Owned(name) {
			require.NotContains(t, w2.Owned(name), k)
		}
		require.Eventually(t, func() bool { // the consumers stop right after the leases move
			st := w1.Stats(name)
			return st.Partitions == parts/2 && st.PartitionsClaimed == parts && st.PartitionsGivenBack == parts/2
		}, eventually, 10*time.Millisecond, "w1 gave two partitions to w2: %+v", w1.Stats(name))
		s.appendStreams(t, streams, streams)
		require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == 2*streams }, eventually, 10*time.Millisecond, "two workers applied the second round")

		stop2() // graceful: its leases are given back at once, not after the TTL
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition again")
		require.Equal(t, []string{"w1", "w1", "w1", "w1"}, s.leaseOwners(t, name, parts))
		require.Eventually(t, func() bool { return w1.Stats(name).PartitionsClaimed == parts+parts/2 }, eventually, 10*time.Millisecond,
			"and took them back")
		s.appendStreams(t, streams, 2*streams)
		require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == 3*streams }, eventually, 10*time.Millisecond, "one worker applied the third round")
		rows, twice := s.streamRows(t, name)
		require.Equal(t, 3*streams, rows)
		require.Zero(t, twice, "no event applied twice")
	})
}

// TestPartitionMovesOnlyBetweenBatches forces a rebalance while a batch of partition 3 is in
// flight on the first worker: the second worker gets the idle partition at once, but partition
// 3 only after that batch committed; the batch is never cut, and nothing is applied twice.
func TestPartitionMovesOnlyBetweenBatches(t *testing.T) {
	s := newSetup(t)
	ch := s.newChannel(t, channels["postgres"])
	const name, parts = "handover", 4
	var (
		holding atomic.Bool
		release = make(chan struct{})
		held    = make(chan struct{}, 1)
	)
	hold := func(e eventstore.Event) <-chan struct{} {
		if eventstore.PartitionOf(e.StreamID, parts) != 3 || !holding.Load() {
			return nil
		}
		select {
		case held <- struct{}{}:
		default:
		}
		return release
	}
	w1, stop1 := s.startStoppable(t, ch, s.leased("w1"), s.streamModel(t, name, parts, hold))
	t.Cleanup(func() { stop1(); require.NoError(t, ch.Close()) })
	require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition")

	holding.Store(true)
	s.appendStreams(t, 40, 0)
	select {
	case <-held:
	case <-time.After(eventually):
		t.Fatal("no batch of partition 3 started")
	}
	w2, _ := s.startStoppable(t, s.secondChannel(t, ch), s.leased("w2"), s.streamModel(t, name, parts, hold))
	require.Eventually(t, func() bool { return slices.Equal(w2.Owned(name), []int{2}) }, eventually, 10*time.Millisecond, "w2 gets the idle partition 2")
	require.Equal(t, "w1", s.leaseOwners(t, name, parts)[3], "partition 3 stays with w1 while its batch runs")
	require.Contains(t, w1.Owned(name), 3)

	holding.Store(false)
	close(release)
	require.Eventually(t, func() bool { return slices.Equal(w2.Owned(name), []int{2, 3}) }, eventually, 10*time.Millisecond, "w2 gets partition 3 after the batch")
	require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == 40 }, eventually, 10*time.Millisecond, "every event applied")
	_, twice := s.streamRows(t, name)
	require.Zero(t, twice)
}

// TestPartitionFailsAloneAndHeals: a poison event fails its partition alone — its trigger is
// dead-lettered under the partition's unit name, listed under the projection's — while the
// other partitions apply every event; replaying the projection's dead letters after the fix
// heals the partition, and a rebuild requested of the projection rebuilds every partition.
func TestPartitionFailsAloneAndHeals(t *testing.T) {
	poisoned.Store(true)
	t.Cleanup(func() { poisoned.Store(false) })
	s := newSetup(t)
	ch := s.newChannel(t, channels["amqp"])
	const name, parts, streams = "poisoned", 4, 40
	cfg := s.leased("w1")
	cfg.Retry = retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}
	s.start(t, ch, cfg, s.streamModel(t, name, parts, nil))
	s.appendStreams(t, streams, 0)
	bad, err := projection.PartitionUnitName(name, eventstore.PartitionOf(poisonStream, parts), parts)
	require.NoError(t, err)
	waiting := s.streamsOf(streams, parts, eventstore.PartitionOf(poisonStream, parts)) // the failing partition's
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{name + "_streams"}.Sanitize()+
			` WHERE stream <> ALL($1)`, waiting).Scan(&n))
		return n == streams-len(waiting)
	}, eventually, 10*time.Millisecond, "every stream of the other partitions")
	recs := s.awaitDeadLetters(t, 1)
	require.Equal(t, bad, recs[0].Projection, "dead-lettered under the failing partition's unit")
	listed, err := s.dead.List(context.Background(), deadletter.Filter{Projection: name})
	require.NoError(t, err)
	require.Len(t, listed, 1, "listed under the projection")
	st, err := s.runner.Status(context.Background(), name)
	require.NoError(t, err)
	require.Equal(t, bad, st.FailingPartition)

	poisoned.Store(false)
	res, err := deadletter.Replay(context.Background(), s.dead, ch, deadletter.ReplayFilter{Projection: name}, "ops", time.Now())
	require.NoError(t, err)
	require.Equal(t, []string{bad}, res.Projections, "the replay is addressed to the partition")
	require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == streams }, eventually, 10*time.Millisecond, "healed")

	before, err := s.runner.Status(context.Background(), name)
	require.NoError(t, err)
	require.NoError(t, ch.Publish(context.Background(), trigger.Trigger{Reason: trigger.ReasonRebuild, Projection: name, At: time.Now(),
		Rebuild: &trigger.RebuildRequest{By: "ops"}}))
	require.Eventually(t, func() bool {
		st, err := s.runner.Status(context.Background(), name)
		require.NoError(t, err)
		rows, _ := s.streamRows(t, name)
		return st.RebuildStartedAt.After(before.RebuildStartedAt) && st.Condition() == projection.ConditionCaughtUp && rows == streams
	}, eventually, 10*time.Millisecond, "every partition rebuilt")
	_, twice := s.streamRows(t, name)
	require.Zero(t, twice)
}

// TestPartitionTriggerOfOtherStreamsCostsNoRead: a trigger lists the partition keys of its
// streams, so on a partitioned projection only the partition of the appended stream catches
// up; the other partitions' subscriptions ack it without a read, and the projection's own
// subscription leaves append triggers to its partitions.
func TestPartitionTriggerOfOtherStreamsCostsNoRead(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	dropping := &droppingChannel{Channel: s.newChannel(t, channels["gochannel"])} // silences the relay
	const name, parts = "keyed", 4
	w := s.start(t, dropping, worker.Config{SafetyNetInterval: -1}, s.streamModel(t, name, parts, nil))
	// Each partition catches up when the worker takes it, and once more in the safety net's
	// start-up round.
	require.Eventually(t, func() bool { return w.Stats(name).CatchUps == 2*parts }, eventually, 5*time.Millisecond, "the start-up catch-ups")
	require.Equal(t, []int{0, 1, 2, 3}, w.Owned(name), "without leases, every partition")
	require.Nil(t, w.Owned(name+".p1"), "a partition is not a projection of the worker")
	res, err := s.store.Append(context.Background(), "s-000", eventstore.Any,
		eventstore.EventData{Type: "A", Payload: []byte(`{"n":1}`)})
	require.NoError(t, err)
	before := w.Stats(name)
	require.NoError(t, dropping.Channel.Publish(context.Background(), trigger.ForAppend(res, time.Now())))
	require.Eventually(t, func() bool {
		st := w.Stats(name)
		return st.Received-before.Received == parts+1 && st.CatchUps-before.CatchUps == 1 && st.Redundant-before.Redundant == parts-1
	}, eventually, 5*time.Millisecond, "one catch-up, in the stream's partition")
	require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == 1 }, eventually, 5*time.Millisecond)
	after := w.Stats(name)
	require.Equal(t, int64(1), after.Ignored-before.Ignored, "the projection's own subscription leaves it to the partitions")
}

// TestLeasesNotMigrated: a worker whose lease tables do not exist (Leases.Schema never
// migrated) fails to start with projection.ErrNotMigrated rather than run without partitions.
func TestLeasesNotMigrated(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, s.streamModel(t, "unmigrated", 2, nil))
	require.NoError(t, err)
	ch := goChannel(t)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: s.logger, DeadLetters: s.dead,
		Leases: &worker.Leases{DB: s.db.Pool, Schema: "elsewhere"}})
	require.NoError(t, err)
	err = w.Run(context.Background())
	require.ErrorIs(t, err, projection.ErrNotMigrated)
	require.ErrorContains(t, err, "partition leases of unmigrated")
}

// TestMaxConcurrentPartitions: with MaxConcurrentPartitions 1, the worker's partitions take
// turns batch by batch — no two partitions' handlers ever run at once (each handler is a round
// trip to the database, so unbounded partitions overlap all the time) — and every event is
// still applied once.
func TestMaxConcurrentPartitions(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	const name, parts, streams = "bounded", 4, 80
	var inFlight, most atomic.Int32
	table := pgx.Identifier{name + "_rows"}.Sanitize()
	p, err := projection.New(name, projection.Config{Partitions: parts, BatchSize: 5,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (stream text PRIMARY KEY)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, e.StreamID)
		return err
	}))
	require.NoError(t, err)
	s.appendStreams(t, streams, 0) // a backlog: the four partitions' start-up catch-ups begin together
	w := s.start(t, s.newChannel(t, channels["gochannel"]), worker.Config{SafetyNetInterval: -1, MaxConcurrentPartitions: 1}, p)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
		return n == streams
	}, eventually, 10*time.Millisecond, "every event applied once (the primary key refuses a second)")
	require.Equal(t, int32(1), most.Load(), "one partition's handler at a time")
	require.Len(t, w.Owned(name), parts)
	_, err = worker.New(worker.Config{Runner: s.runner, Channel: goChannel(t), DeadLetters: s.dead, MaxConcurrentPartitions: -1})
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
}

// TestClaimedPartitionCatchUpRetried: the catch-ups of the partitions the worker has just
// claimed run out of time (the first four batches outlast BatchTimeout: an outage would do the
// same) — as many as the claims and the safety net's start-up round can run. With every trigger
// lost and no safety-net tick, nothing but the claims' retries can apply the backlog, and they
// do, once.
func TestClaimedPartitionCatchUpRetried(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	dropping := &droppingChannel{Channel: s.newChannel(t, channels["gochannel"])} // every trigger lost
	const name, streams = "retried", 10
	table := pgx.Identifier{name + "_rows"}.Sanitize()
	var stalled atomic.Int32
	p, err := projection.New(name, projection.Config{Partitions: 2, MaxBatchDuration: 50 * time.Millisecond, BatchTimeout: 200 * time.Millisecond,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (stream text PRIMARY KEY)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if stalled.Add(1) <= 4 {
			<-ctx.Done() // hangs until its BatchTimeout
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, e.StreamID)
		return err
	}))
	require.NoError(t, err)
	s.appendStreams(t, streams, 0)
	// The backlog must be readable before the start: the store's horizon is the cluster's, and a
	// transaction another test holds open could keep it unreadable through the first catch-ups,
	// which would then succeed with nothing to read.
	head, err := s.store.Append(context.Background(), "s-last", eventstore.Any, eventstore.EventData{Type: "B", Payload: []byte(`{}`)})
	require.NoError(t, err)
	storetest.Settle(t, s.store, head.Last())
	s.start(t, dropping, s.leased("w1"), p)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
		return n == streams
	}, eventually, 10*time.Millisecond, "the backlog applied, once (the primary key refuses a second)")
	require.GreaterOrEqual(t, stalled.Load(), int32(streams+4), "the stalled batches ran again")
}

// barrierChannel's partition subscribers (units named <projection>.p<k>) close only once all
// units of them are closing at the same time; a close that waits longer than eventually goes on
// and is counted as late (and the closes after it do not wait).
type barrierChannel struct {
	channel.Channel
	units   int32
	made    atomic.Int32
	closing atomic.Int32
	late    atomic.Int32
	all     chan struct{}
}

type barrierSubscriber struct {
	message.Subscriber
	c *barrierChannel
}

func (c *barrierChannel) Subscriber(unit string) (message.Subscriber, string, error) {
	sub, topic, err := c.Channel.Subscriber(unit)
	if err != nil || !strings.Contains(unit, ".p") {
		return sub, topic, err
	}
	c.made.Add(1)
	return barrierSubscriber{Subscriber: sub, c: c}, topic, nil
}

func (b barrierSubscriber) Close() error {
	if b.c.closing.Add(1) == b.c.units {
		close(b.c.all)
	}
	if b.c.late.Load() > 0 {
		return b.Subscriber.Close() // one waited in vain already
	}
	select {
	case <-b.c.all:
	case <-time.After(eventually):
		b.c.late.Add(1)
	}
	return b.Subscriber.Close()
}

// TestStopClosesPartitionsTogether: a stopping worker closes its partitions' subscribers at
// the same time, not one after the other (each close is a round trip to the broker, and a
// worker may own hundreds of partitions): here no close ends before all have begun.
func TestStopClosesPartitionsTogether(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	const name, parts = "closing", 8
	ch := &barrierChannel{Channel: s.newChannel(t, channels["gochannel"]), units: parts, all: make(chan struct{})}
	w, stop := s.startStoppable(t, ch, worker.Config{SafetyNetInterval: -1}, s.streamModel(t, name, parts, nil))
	require.Eventually(t, func() bool { return w.Stats(name).Partitions == parts && ch.made.Load() == parts }, eventually, 10*time.Millisecond,
		"every partition has its subscriber")
	stop()
	require.Equal(t, int32(parts), ch.closing.Load(), "every partition's subscriber closed")
	require.Zero(t, ch.late.Load(), "closes that waited for the others in vain: the subscribers were closed one by one")
}
