package amqp

import (
	"strings"

	"github.com/ThreeDotsLabs/watermill"
)

// queueLogger tags watermill-amqp's lines about a projection's queue with the projection. The
// subscribers share one connection, and watermill-amqp logs a subscriber's lines through the
// connection's logger, not the subscriber's: so the projection is read from the queue name in
// the line's fields ("amqp_queue_name", prefix + "nudge.triggers_" + projection).
type queueLogger struct {
	watermill.LoggerAdapter
	prefix string // the queue names' common start, the projection's name follows it
}

func (l queueLogger) fields(fields watermill.LogFields) watermill.LogFields {
	queue, ok := fields["amqp_queue_name"].(string)
	if !ok || !strings.HasPrefix(queue, l.prefix) {
		return fields
	}
	if _, set := fields["projection"]; set {
		return fields
	}
	return fields.Add(watermill.LogFields{"projection": strings.TrimPrefix(queue, l.prefix)})
}

func (l queueLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.LoggerAdapter.Error(msg, err, l.fields(fields))
}

func (l queueLogger) Info(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Info(msg, l.fields(fields))
}

func (l queueLogger) Debug(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Debug(msg, l.fields(fields))
}

func (l queueLogger) Trace(msg string, fields watermill.LogFields) {
	l.LoggerAdapter.Trace(msg, l.fields(fields))
}

func (l queueLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return queueLogger{l.LoggerAdapter.With(l.fields(fields)), l.prefix}
}
