package amqp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/trigger"
)

// TestDeclarePartitionsRoutesByPartition publishes triggers with the keys of several
// partitions, and without keys, and checks that each unit's queue of two partitioned
// projections (4 and 6 partitions) gets exactly the triggers of its partition and the
// key-less ones, in order, and an unpartitioned projection's queue every trigger.
func TestDeclarePartitionsRoutesByPartition(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ch := newChannel(t, config(t, env))
	ctx := context.Background()
	units := map[string][]string{}
	for _, p := range []struct {
		name  string
		count int
	}{{"four", 4}, {"six", 6}} {
		for k := range p.count {
			units[p.name] = append(units[p.name], fmt.Sprintf("%s.p%d", p.name, k))
		}
		require.NoError(t, ch.DeclarePartitions(ctx, units[p.name]...))
	}
	require.NoError(t, ch.Declare(ctx, "plain"))

	triggers := [][]uint32{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {11}, {1, 6}, nil, {23, 12, 35}, {0x7fffffff}, nil}
	for i, keys := range triggers {
		tr := channeltest.Trigger(int64(i + 1))
		tr.Keys = keys
		require.NoError(t, ch.Publish(ctx, tr))
	}
	conn, err := amqp091.Dial(env.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	amqpCh, err := conn.Channel()
	require.NoError(t, err)

	for projection, us := range units {
		for k, unit := range us {
			var want []int64
			for i, keys := range triggers {
				if concerns(keys, k, len(us)) {
					want = append(want, int64(i+1))
				}
			}
			require.Equal(t, want, drain(t, amqpCh, ch.QueueName(unit), len(want)), "%s partition %d", projection, k)
		}
	}
	all := make([]int64, len(triggers))
	for i := range all {
		all[i] = int64(i + 1)
	}
	require.Equal(t, all, drain(t, amqpCh, ch.QueueName("plain"), len(triggers)), "the unpartitioned projection gets every trigger")
}

// concerns reports whether a trigger with keys concerns partition index of count.
func concerns(keys []uint32, index, count int) bool {
	if len(keys) == 0 {
		return true
	}
	for _, k := range keys {
		if int(k%uint32(count)) == index {
			return true
		}
	}
	return false
}

// drain gets want messages from queue (waiting for them), then checks that no more come, and
// returns the triggers' global positions in the order received. Every queue's last trigger
// is key-less: a queue whose messages are all there holds nothing after it.
func drain(t *testing.T, ch *amqp091.Channel, queue string, want int) []int64 {
	t.Helper()
	var got []int64
	require.Eventually(t, func() bool {
		for {
			d, ok, err := ch.Get(queue, true)
			require.NoError(t, err)
			if !ok {
				return len(got) >= want
			}
			tr, err := trigger.Decode(d.Body)
			require.NoError(t, err)
			_, cc := d.Headers["CC"]
			require.True(t, cc || len(tr.Keys) == 0, "a keyed trigger carries its routing keys")
			got = append(got, tr.Position.GlobalPosition)
		}
	}, 10*time.Second, 20*time.Millisecond)
	return got
}

var _ channel.PartitionDeclarer = (*amqp.Channel)(nil)

// TestDeclarePartitionsChecksTheQueueType: units whose queues exist as classic queues fail
// DeclarePartitions of a channel configured for quorum queues with a *QueueMismatchError, as
// Declare does, though it only looks the existing queues up (the first unit is declared).
func TestDeclarePartitionsChecksTheQueueType(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ctx := context.Background()
	units := []string{"beta.p0", "beta.p1", "beta.p2"}
	require.NoError(t, newChannel(t, config(t, env)).DeclarePartitions(ctx, units...))
	quorum := newChannel(t, quorumConfig(t, env))
	err := quorum.DeclarePartitions(ctx, units...)
	var mismatch *amqp.QueueMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.ErrorIs(t, err, amqp.ErrQueueTypeMismatch)
	require.Equal(t, quorum.QueueName("beta.p0"), mismatch.Queue)
	require.NoError(t, newChannel(t, config(t, env)).DeclarePartitions(ctx, units...), "declared again as they are")
}
