package amqp

import (
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
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
