package amqp_test

import (
	"context"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/trigger"
)

// TestHeadersOfAnyType: a trigger whose headers are not all strings (another publisher's, or
// RabbitMQ's own x-delivery-count on a quorum queue's redelivery) reaches the consumer, its
// headers as text. watermill-amqp's DefaultMarshaler refuses it and nacks it back for ever.
func TestHeadersOfAnyType(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ch := newChannel(t, config(t, env))
	ctx := context.Background()
	msgs := subscribe(t, ch, "alpha")

	msg, err := trigger.NewMessage(channeltest.Trigger(9))
	require.NoError(t, err)
	conn, err := amqp091.Dial(env.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	raw, err := conn.Channel()
	require.NoError(t, err)
	headers := amqp091.Table{"_watermill_message_uuid": "foreign-1", "x-count": int32(7), "x-flag": true, "x-bytes": []byte("b")}
	for key, value := range msg.Metadata {
		headers[key] = value
	}
	require.NoError(t, raw.PublishWithContext(ctx, "", ch.QueueName("alpha"), false, false,
		amqp091.Publishing{Headers: headers, Body: msg.Payload, DeliveryMode: amqp091.Persistent}))

	got := nextMessage(t, msgs)
	got.Ack()
	require.Equal(t, "foreign-1", got.UUID)
	require.Equal(t, "7", got.Metadata.Get("x-count"))
	require.Equal(t, "true", got.Metadata.Get("x-flag"))
	require.Equal(t, "b", got.Metadata.Get("x-bytes"))
	tr, err := trigger.FromMessage(got)
	require.NoError(t, err)
	require.Equal(t, int64(9), tr.Position.GlobalPosition)
}
