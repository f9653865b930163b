package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// BenchmarkAppendOverhead measures append throughput (8 writers, 10 events per transaction)
// with each way of publishing triggers, beside the bare store in the same run:
//
//   - bare: no triggers;
//   - relay/amqp: a relay.Relay tails the store and publishes to RabbitMQ meanwhile (the
//     design chosen for RabbitMQ: appends write nothing more);
//   - outbox: Watermill's forwarder outbox, one envelope row written in each append's
//     transaction (the alternative for RabbitMQ, measured for the comparison; the forwarder
//     that would carry the rows on to RabbitMQ does not run). It reports triggers/s: the rate
//     at which the forwarder would have to publish to RabbitMQ, one confirmed publish each;
//   - intx/postgres-N: relay.Appender with the PostgreSQL-queue channel, N projections.
func BenchmarkAppendOverhead(b *testing.B) {
	events := make([]eventstore.EventData, 10)
	for i := range events {
		events[i] = storeEvent(i)
	}
	run := func(b *testing.B, appendFunc func(ctx context.Context, stream string) error) {
		var streams atomic.Int64
		b.SetParallelism(4) // 8 goroutines on 2 cores
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			stream := fmt.Sprintf("stream-%d", streams.Add(1))
			for pb.Next() {
				if err := appendFunc(context.Background(), stream); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
	}

	b.Run("bare", func(b *testing.B) {
		s := newSetup(b)
		run(b, func(ctx context.Context, stream string) error {
			_, err := s.store.Append(ctx, stream, eventstore.Any, events...)
			return err
		})
	})
	b.Run("relay/amqp", func(b *testing.B) {
		s := newSetup(b)
		ch := s.newChannel(b, channels["amqp"])
		require.NoError(b, ch.Declare(context.Background(), "alpha"))
		rel, err := relay.New(s.backend, ch, relay.Config{Logger: s.logger})
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- rel.Run(ctx) }()
		b.Cleanup(func() { cancel(); require.NoError(b, <-done); require.NoError(b, ch.Close()) })
		run(b, func(ctx context.Context, stream string) error {
			_, err := s.store.Append(ctx, stream, eventstore.Any, events...)
			return err
		})
	})
	b.Run("outbox", func(b *testing.B) {
		s := newSetup(b)
		logger := watermill.NewSlogLogger(s.logger)
		schema := wmsql.DefaultPostgreSQLSchema{}
		init, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(s.db.Pool), wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
		require.NoError(b, err)
		msg, err := trigger.NewMessage(trigger.Trigger{Reason: trigger.ReasonAppend, At: time.Now()})
		require.NoError(b, err)
		require.NoError(b, init.Publish("nudge_outbox", msg)) // creates the outbox table
		defer func() { b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "triggers/s") }()
		run(b, func(ctx context.Context, stream string) error {
			return s.store.RunInTx(ctx, func(tx pgx.Tx) error {
				res, err := s.store.AppendTx(ctx, tx, stream, eventstore.Any, events...)
				if err != nil {
					return err
				}
				pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
				if err != nil {
					return err
				}
				msg, err := trigger.NewMessage(trigger.ForAppend(res, time.Now()))
				if err != nil {
					return err
				}
				msg.SetContext(ctx)
				return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: "nudge_outbox"}).Publish(channel.TriggerTopic, msg)
			})
		})
	})
	for _, projections := range []int{1, 10} {
		b.Run(fmt.Sprintf("intx/postgres-%d", projections), func(b *testing.B) {
			s := newSetup(b)
			ch, err := pgchannel.New(s.db.Pool, pgchannel.Config{Logger: s.logger})
			require.NoError(b, err)
			b.Cleanup(func() { require.NoError(b, ch.Close()) })
			for i := range projections {
				require.NoError(b, ch.Declare(context.Background(), fmt.Sprintf("p%02d", i)))
			}
			appender, err := relay.NewAppender(s.store, ch)
			require.NoError(b, err)
			run(b, func(ctx context.Context, stream string) error {
				_, err := appender.Append(ctx, stream, eventstore.Any, events...)
				return err
			})
		})
	}
}
