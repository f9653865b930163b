package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
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
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
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

func leases(owner string) *worker.Leases {
	return &worker.Leases{Owner: owner, TTL: 4 * time.Second, Renew: 100 * time.Millisecond}
}

// TestPartitionsSpreadOverWorkers: a projection of 4 partitions runs on one worker (every
// partition its own), then on two (two each, disjoint, as the lease table says), then on one
// again after the other stops (its leases given back at once); on every channel, every
// stream's events are applied once and in order throughout.
func TestPartitionsSpreadOverWorkers(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		const name, parts, streams = "spread", 4, 40
		cfg := func(owner string) worker.Config {
			l := leases(owner)
			l.DB = s.db.Pool
			return worker.Config{Leases: l, SafetyNetInterval: -1}
		}
		w1, stop1 := s.startStoppable(t, ch, cfg("w1"), s.streamModel(t, name, parts, nil))
		t.Cleanup(func() { stop1(); require.NoError(t, ch.Close()) })
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition")
		s.appendStreams(t, streams, 0)
		require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == streams }, eventually, 10*time.Millisecond, "one worker applied the first round")

		w2, stop2 := s.startStoppable(t, s.secondChannel(t, ch), cfg("w2"), s.streamModel(t, name, parts, nil))
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts/2 && len(w2.Owned(name)) == parts/2 }, eventually, 10*time.Millisecond, "two each")
		owners := s.leaseOwners(t, name, parts)
		require.ElementsMatch(t, []string{"w1", "w1", "w2", "w2"}, owners, "the lease table agrees")
		for _, k := range w1.Owned(name) {
			require.NotContains(t, w2.Owned(name), k)
		}
		s.appendStreams(t, streams, streams)
		require.Eventually(t, func() bool { rows, _ := s.streamRows(t, name); return rows == 2*streams }, eventually, 10*time.Millisecond, "two workers applied the second round")

		stop2() // graceful: its leases are given back at once, not after the TTL
		require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition again")
		require.Equal(t, []string{"w1", "w1", "w1", "w1"}, s.leaseOwners(t, name, parts))
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
	cfg := func(owner string) worker.Config {
		l := leases(owner)
		l.DB = s.db.Pool
		return worker.Config{Leases: l, SafetyNetInterval: -1}
	}
	w1, stop1 := s.startStoppable(t, ch, cfg("w1"), s.streamModel(t, name, parts, hold))
	t.Cleanup(func() { stop1(); require.NoError(t, ch.Close()) })
	require.Eventually(t, func() bool { return len(w1.Owned(name)) == parts }, eventually, 10*time.Millisecond, "w1 owns every partition")

	holding.Store(true)
	s.appendStreams(t, 40, 0)
	select {
	case <-held:
	case <-time.After(eventually):
		t.Fatal("no batch of partition 3 started")
	}
	w2, _ := s.startStoppable(t, s.secondChannel(t, ch), cfg("w2"), s.streamModel(t, name, parts, hold))
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
