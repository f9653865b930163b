package amqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/amqptest"
)

// BenchmarkPublish measures confirmed publishes of a trigger to one durable projection queue,
// from 1 and 4 goroutines, with several publishing channel pools (PublishChannels). msgs/s is
// the throughput of the whole run.
func BenchmarkPublish(b *testing.B) {
	for _, channels := range []int{1, amqp.PublishChannelsDefault, 8} {
		for _, goroutines := range []int{1, 4} {
			b.Run(fmt.Sprintf("channels=%d/goroutines=%d", channels, goroutines), func(b *testing.B) {
				env := amqptest.New(b)
				cfg := config(b, env)
				cfg.PublishChannels = channels
				ch := newChannel(b, cfg)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				require.NoError(b, ch.Declare(ctx, "alpha"))
				tr := channeltest.Trigger(1)
				b.ResetTimer()
				var wg sync.WaitGroup
				for w := range goroutines {
					wg.Go(func() {
						for i := w; i < b.N; i += goroutines {
							if err := ch.Publish(ctx, tr); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkDeclare measures declaring the subscriptions of a worker with 50 projections of 64
// partitions each (3,250 queues) on a fresh prefix, with Declare alone (every unit bound to the
// fanout exchange) and with DeclarePartitions for the units (routed by partition): the queues
// are new in the first round and exist in the others (a restart). ms/declare is the time of
// one round.
func BenchmarkDeclare(b *testing.B) {
	for _, partitions := range []bool{false, true} {
		b.Run(fmt.Sprintf("partitions=%t", partitions), func(b *testing.B) {
			env := amqptest.New(b)
			ch := newChannel(b, config(b, env))
			ctx := context.Background()
			var names []string
			units := make([][]string, 50)
			for p := range 50 {
				names = append(names, fmt.Sprintf("proj_%02d", p))
				for k := range 64 {
					units[p] = append(units[p], fmt.Sprintf("proj_%02d.p%02d", p, k))
				}
			}
			b.ResetTimer()
			for b.Loop() {
				began := time.Now()
				require.NoError(b, ch.Declare(ctx, names...))
				for _, us := range units {
					if partitions {
						require.NoError(b, ch.DeclarePartitions(ctx, us...))
					} else {
						require.NoError(b, ch.Declare(ctx, us...))
					}
				}
				b.Logf("declared %d names in %s", len(names)*65, time.Since(began))
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/declare")
		})
	}
}
