package amqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
