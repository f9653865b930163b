package amqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// QueueType is the kind of queue the channel declares for each projection.
type QueueType string

const (
	// QueueClassic declares classic queues, RabbitMQ's default kind: durable, on one node.
	QueueClassic QueueType = "classic"
	// QueueQuorum declares quorum queues, replicated across a cluster's nodes by Raft: the
	// production choice for a clustered broker. The channel declares them with no delivery
	// limit, so a trigger nacked during a long outage is never dropped by the broker.
	QueueQuorum QueueType = "quorum"
)

// QueueTypeDefault is Config.QueueType's default.
const QueueTypeDefault = QueueClassic

// QueueTypes lists every QueueType.
func QueueTypes() []QueueType { return []QueueType{QueueClassic, QueueQuorum} }

// ErrQueueTypeMismatch reports that a projection's queue exists on the broker as another kind
// than Config.QueueType. RabbitMQ cannot change a queue's kind: delete the queue (a trigger is
// only a nudge; the worker's start-up catch-up and safety net find the work it announced) and
// start the worker again, or keep the kind the queue has.
var ErrQueueTypeMismatch = errors.New("amqp: the projection's queue exists with another queue type")

// valid reports whether t is one of QueueTypes.
func (t QueueType) valid() bool {
	for _, v := range QueueTypes() {
		if t == v {
			return true
		}
	}
	return false
}

// queueArguments returns the x-arguments of a projection's queue of type t on a broker whose
// major version is serverMajor (0 when unknown).
//
// A quorum queue has no delivery limit on RabbitMQ 3.x unless one is set; from 4.0 on it has a
// default of 20, past which the broker drops a message nacked again, and -1 lifts it. On 3.x
// -1 is accepted but drops a message at its first nack, so it is sent to 4.0 and later only.
func queueArguments(t QueueType, serverMajor int) amqp091.Table {
	if t != QueueQuorum {
		return nil
	}
	args := amqp091.Table{"x-queue-type": string(QueueQuorum)}
	if serverMajor >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

// serverMajor returns the major version in a broker's "version" server property, or 0.
func serverMajor(props amqp091.Table) int {
	v, _ := props["version"].(string)
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0
	}
	return n
}

// queueTypeError turns the broker's refusal to redeclare a queue as another kind into
// ErrQueueTypeMismatch; it returns nil for any other error.
func (c *Channel) queueTypeError(queue string, err error) error {
	var amqpErr *amqp091.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp091.PreconditionFailed ||
		!strings.Contains(amqpErr.Reason, "'x-queue-type'") {
		return nil
	}
	return fmt.Errorf("%w: queue %s is not a %s queue (Config.QueueType); RabbitMQ cannot change a queue's type: "+
		"delete the queue and start the worker again (its start-up catch-up finds the work the queued triggers announced), "+
		"or set Config.QueueType to the type it has: %s", ErrQueueTypeMismatch, queue, c.cfg.QueueType, amqpErr.Reason)
}
