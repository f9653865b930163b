package amqp

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/trigger"
)

func TestQueueArguments(t *testing.T) {
	require.Nil(t, queueArguments(QueueClassic, 4))
	require.Equal(t, amqp091.Table{"x-queue-type": "quorum"}, queueArguments(QueueQuorum, 3),
		"RabbitMQ 3 has no delivery limit by default, and -1 would drop at the first nack")
	require.Equal(t, amqp091.Table{"x-queue-type": "quorum"}, queueArguments(QueueQuorum, 0), "unknown version: no limit set")
	require.Equal(t, amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(-1)}, queueArguments(QueueQuorum, 4),
		"RabbitMQ 4's default limit of 20 is lifted")
}

func TestServerMajor(t *testing.T) {
	for v, want := range map[any]int{"3.10.8": 3, "4.0.5": 4, "": 0, "x.y": 0, 42: 0} {
		require.Equal(t, want, serverMajor(amqp091.Table{"version": v}), "%v", v)
	}
	require.Equal(t, 0, serverMajor(nil))
}

// TestQuorumQueueProperties: what the channel declares and consumes is what a quorum queue
// accepts — durable, not exclusive, not auto-deleted, no priority, and a per-consumer prefetch
// (a quorum queue refuses global QoS with a connection error, 540) — so no combination reaches
// the broker as a channel error at run time.
func TestQuorumQueueProperties(t *testing.T) {
	c := &Channel{cfg: Config{QueueType: QueueQuorum}.WithDefaults(), serverMajor: 4, triggerTopic: "nudge.triggers"}
	cfg := c.projectionConfig("alpha")
	require.True(t, cfg.Queue.Durable)
	require.False(t, cfg.Queue.Exclusive)
	require.False(t, cfg.Queue.AutoDelete)
	require.NotContains(t, cfg.Queue.Arguments, "x-max-priority")
	require.Equal(t, "quorum", cfg.Queue.Arguments["x-queue-type"])
	require.False(t, cfg.Consume.Exclusive, "quorum queues have no exclusive consumers")
	require.False(t, cfg.Consume.Qos.Global, "quorum queues refuse global QoS")
	require.Equal(t, 1, cfg.Consume.Qos.PrefetchCount)
}

func TestQueueMismatchParsing(t *testing.T) {
	for _, tc := range []struct {
		reason, arg, have string
	}{
		{"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'quorum' but current is 'stream'", "x-queue-type", "stream"},
		{"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none", "x-queue-type", ""},
		{"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received none but current is the value 'quorum' of type 'longstr'", "x-queue-type", "quorum"},
		{"PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '-1' but current is '5'", "x-delivery-limit", "5"},
	} {
		err := queueMismatch("q", amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(-1)},
			&amqp091.Error{Code: amqp091.PreconditionFailed, Reason: tc.reason})
		require.NotNil(t, err, tc.reason)
		require.Equal(t, tc.arg, err.Argument)
		require.Equal(t, tc.have, err.Have, tc.reason)
	}
	require.Nil(t, queueMismatch("q", nil, &amqp091.Error{Code: amqp091.PreconditionFailed, Reason: "PRECONDITION_FAILED - invalid arg 'x-max-priority'"}))
	require.Nil(t, queueMismatch("q", nil, &amqp091.Error{Code: amqp091.NotFound, Reason: "inequivalent arg 'x'"}))
	require.Nil(t, queueMismatch("q", nil, errors.New("inequivalent arg 'x'")))
}

// syncBuffer collects a channel's logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// declareRaw declares queue as another process (an earlier deployment, an older broker) did.
func declareRaw(t *testing.T, env *amqptest.Env, queue string, args amqp091.Table) {
	t.Helper()
	conn, err := amqp091.Dial(env.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	raw, err := conn.Channel()
	require.NoError(t, err)
	_, err = raw.QueueDeclare(queue, true, false, false, false, args)
	require.NoError(t, err)
}

// on4 is a quorum channel that takes the broker for RabbitMQ 4 (this test broker may be 3.x).
func on4(t *testing.T, env *amqptest.Env, logs *syncBuffer) *Channel {
	t.Helper()
	c, err := New(context.Background(), Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName,
		QueueType: QueueQuorum, Logger: slog.New(slog.NewTextHandler(logs, nil)), StartupTimeout: testwait.For(time.Minute)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	c.serverMajor = 4
	return c
}

// TestQuorumQueueFromRabbitMQ3: on RabbitMQ 4 a quorum queue declared on RabbitMQ 3 (with no
// delivery limit) cannot take the -1 that lifts 4's default limit (the broker refuses the
// redeclaration, 406). The channel declares and consumes it as it is, and warns that the
// broker's default limit applies and how to lift it.
func TestQuorumQueueFromRabbitMQ3(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	var logs syncBuffer
	c := on4(t, env, &logs)
	queue := c.QueueName("alpha")
	declareRaw(t, env, queue, amqp091.Table{"x-queue-type": "quorum"})

	ctx := context.Background()
	require.NoError(t, c.Declare(ctx, "alpha"))
	require.Contains(t, logs.String(), "delivery-limit -1")
	require.Contains(t, logs.String(), "queue="+queue)

	sub, topic, err := c.Subscriber("alpha")
	require.NoError(t, err)
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(t, err, "the subscription declares the queue as Declare did")
	require.NoError(t, c.Publish(ctx, channeltest.Trigger(7)))
	select {
	case msg := <-msgs:
		tr, err := trigger.FromMessage(msg)
		require.NoError(t, err)
		require.Equal(t, int64(7), tr.Position.GlobalPosition)
		msg.Ack()
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("no trigger came")
	}
}

// TestDeliveryLimitMismatch: a quorum queue someone declared with a delivery limit of its own
// is not redeclared: Declare fails with a *QueueMismatchError naming the queue, the limit it
// has and what to do.
func TestDeliveryLimitMismatch(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	c := on4(t, env, &syncBuffer{})
	queue := c.QueueName("alpha")
	declareRaw(t, env, queue, amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(5)})

	err := c.Declare(context.Background(), "alpha")
	var mismatch *QueueMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.NotErrorIs(t, err, ErrQueueTypeMismatch)
	require.Equal(t, QueueMismatchError{Queue: queue, Argument: "x-delivery-limit", Want: "-1", Have: "5", Reason: mismatch.Reason}, *mismatch)
	require.ErrorContains(t, err, "queue "+queue+" has x-delivery-limit 5, where this channel declares -1")
	require.ErrorContains(t, err, "delete the queue")
}
