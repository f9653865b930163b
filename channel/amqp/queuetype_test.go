package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/trigger"
)

func quorumConfig(t testing.TB, env *amqptest.Env) amqp.Config {
	cfg := config(t, env)
	cfg.QueueType = amqp.QueueQuorum
	return cfg
}

// TestQuorumSuite runs the channel's whole conformance suite on quorum queues.
func TestQuorumSuite(t *testing.T) {
	t.Parallel()
	channeltest.Run(t, func(t *testing.T) (channel.Channel, channeltest.RestartFunc) {
		env := amqptest.New(t)
		return suiteChannel(t, env, quorumConfig(t, env))
	})
}

// redeclare declares queue on a channel of its own with args and returns the broker's answer.
func redeclare(t *testing.T, env *amqptest.Env, queue string, args amqp091.Table) error {
	t.Helper()
	conn, err := amqp091.Dial(env.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	raw, err := conn.Channel()
	require.NoError(t, err)
	_, err = raw.QueueDeclare(queue, true, false, false, false, args)
	return err
}

// TestQuorumQueueDeclared: with QueueQuorum the projection's queue is a quorum queue — the
// broker refuses to redeclare it as a classic one and accepts it as a quorum one.
func TestQuorumQueueDeclared(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ch := newChannel(t, quorumConfig(t, env))
	require.NoError(t, ch.Declare(context.Background(), "alpha"))
	queue := ch.QueueName("alpha")
	err := redeclare(t, env, queue, amqp091.Table{"x-queue-type": "classic"})
	require.ErrorContains(t, err, "inequivalent arg 'x-queue-type'", "the queue is not classic")
	require.NoError(t, redeclare(t, env, queue, amqp091.Table{"x-queue-type": "quorum"}))
}

// TestQueueTypeMismatch: a worker configured for quorum queues meeting a projection's classic
// queue (declared by an earlier deployment) fails with a *QueueMismatchError, matching
// ErrQueueTypeMismatch, that names the queue and both types and says what to do; the queue is
// left as it was. The other way round likewise.
func TestQueueTypeMismatch(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	classic := newChannel(t, config(t, env))
	require.NoError(t, classic.Declare(context.Background(), "alpha"))
	queue := classic.QueueName("alpha")

	quorum := newChannel(t, quorumConfig(t, env))
	err := quorum.Declare(context.Background(), "alpha")
	require.ErrorIs(t, err, amqp.ErrQueueTypeMismatch)
	var mismatch *amqp.QueueMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.Equal(t, queue, mismatch.Queue)
	require.Equal(t, "x-queue-type", mismatch.Argument)
	require.Equal(t, "quorum", mismatch.Want)
	require.Empty(t, mismatch.Have, "declared without a type")
	require.ErrorContains(t, err, "queue "+queue+" is a classic queue, not a quorum queue")
	require.ErrorContains(t, err, `set Config.QueueType to "classic", or delete the queue`)
	require.NoError(t, redeclare(t, env, queue, nil), "the classic queue is still there, unchanged")

	require.NoError(t, quorum.Declare(context.Background(), "beta"))
	err = classic.Declare(context.Background(), "beta")
	require.ErrorIs(t, err, amqp.ErrQueueTypeMismatch)
	require.ErrorContains(t, err, "queue "+quorum.QueueName("beta")+" is a quorum queue, not a classic queue")
	require.ErrorContains(t, err, `set Config.QueueType to "quorum"`)
	require.ErrorAs(t, err, &mismatch)
	require.Equal(t, "quorum", mismatch.Have)
	require.Empty(t, mismatch.Want)
}

// TestQuorumQueueKeepsNackedTriggers: a trigger nacked many times (a projection's outage) is
// redelivered every time, never dropped by a delivery limit (RabbitMQ 4 sets one of 20 on quorum
// queues by default; on RabbitMQ 3 the value that lifts it there, -1, drops at the first nack).
func TestQuorumQueueKeepsNackedTriggers(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ch := newChannel(t, quorumConfig(t, env))
	ctx := context.Background()
	msgs := subscribe(t, ch, "alpha")
	require.NoError(t, ch.Publish(ctx, channeltest.Trigger(5)))

	const nacks = 25
	for i := range nacks + 1 {
		msg := nextMessage(t, msgs)
		tr, err := trigger.FromMessage(msg)
		require.NoError(t, err)
		require.Equal(t, int64(5), tr.Position.GlobalPosition, "delivery %d", i+1)
		if i < nacks {
			msg.Nack()
			continue
		}
		msg.Ack()
	}
}

// subscribe declares the projection's queue and consumes it raw, until the test ends, so
// that a test can ack and nack each message itself.
func subscribe(t *testing.T, ch *amqp.Channel, projection string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, ch.Declare(ctx, projection))
	sub, topic, err := ch.Subscriber(projection)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	return msgs
}

func nextMessage(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg := <-msgs:
		return msg
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("no message came")
	}
	return nil
}
