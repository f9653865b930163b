package amqp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// QueueType is the kind of queue the channel declares for each projection.
type QueueType string

const (
	// QueueClassic declares classic queues, RabbitMQ's default kind: durable, on one node. The
	// queue is declared without an x-queue-type argument, as before QueueType existed, so on a
	// vhost (or node) whose default queue type is quorum it becomes a quorum queue, with the
	// broker's default delivery limit: set QueueQuorum there.
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

// The queue arguments the channel declares.
const (
	argQueueType     = "x-queue-type"
	argDeliveryLimit = "x-delivery-limit"
)

// ErrQueueTypeMismatch reports that a projection's queue exists on the broker as another kind
// than Config.QueueType (a *QueueMismatchError says which). RabbitMQ cannot change a queue's
// kind: delete the queue (a trigger is only a nudge; the worker's start-up catch-up and safety
// net find the work it announced) and start the worker again, or keep the kind the queue has.
var ErrQueueTypeMismatch = errors.New("amqp: the projection's queue exists with another queue type")

// QueueMismatchError is Declare's error for a projection's queue that exists on the broker with
// an argument other than the one the channel declares (RabbitMQ's PRECONDITION_FAILED, 406). It
// matches ErrQueueTypeMismatch when the argument is the queue's type.
type QueueMismatchError struct {
	// Queue is the queue's name.
	Queue string
	// Argument is the queue argument that differs: "x-queue-type" or "x-delivery-limit".
	Argument string
	// Want is the value the channel declares, and Have the value the queue has; "" means the
	// argument is absent (for x-queue-type: a classic queue, declared without a type).
	Want, Have string
	// Reason is the broker's message.
	Reason string
}

// Is makes errors.Is(err, ErrQueueTypeMismatch) true when the queue's type differs.
func (e *QueueMismatchError) Is(target error) bool {
	return target == ErrQueueTypeMismatch && e.Argument == argQueueType
}

func (e *QueueMismatchError) Error() string {
	if e.Argument == argQueueType {
		want, have := queueTypeName(e.Want), queueTypeName(e.Have)
		return fmt.Sprintf("%v: queue %s is a %s queue, not a %s queue (Config.QueueType %s); RabbitMQ cannot change a queue's type: "+
			"set Config.QueueType to %q, or delete the queue and start the worker again "+
			"(its start-up catch-up finds the work the queued triggers announced)", ErrQueueTypeMismatch, e.Queue, have, want, want, have)
	}
	return fmt.Sprintf("amqp: queue %s has %s %s, where this channel declares %s; RabbitMQ cannot change it on an existing queue: "+
		"delete the queue and start the worker again: its start-up catch-up finds the work the queued triggers announced "+
		"(RabbitMQ: %s)", e.Queue, e.Argument, argValueName(e.Have), argValueName(e.Want), e.Reason)
}

// queueTypeName names a queue type argument's value; a queue declared without one is classic.
func queueTypeName(v string) string { return cmp.Or(v, string(QueueClassic)) }

// argValueName names an argument's value, or its absence.
func argValueName(v string) string {
	if v == "" {
		return "none"
	}
	return v
}

// valid reports whether t is one of QueueTypes.
func (t QueueType) valid() bool {
	for _, v := range QueueTypes() {
		if t == v {
			return true
		}
	}
	return false
}

// queueTypeProblem says what is wrong with a Config.QueueType, or "" if nothing is.
func queueTypeProblem(t QueueType) string {
	switch {
	case t.valid():
		return ""
	case strings.EqualFold(string(t), "stream"):
		return fmt.Sprintf("is %q, which the channel does not support: a stream is a log read from an offset that keeps every message, "+
			"not a queue whose consumers share and remove its messages; use %q for a replicated queue", t, QueueQuorum)
	}
	return fmt.Sprintf("is %q; it must be one of %q", t, QueueTypes())
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
	args := amqp091.Table{argQueueType: string(QueueQuorum)}
	if serverMajor >= 4 {
		args[argDeliveryLimit] = int64(-1)
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

var (
	inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)
	quotedValue     = regexp.MustCompile(`'([^']*)'`)
)

// queueMismatch turns the broker's refusal to redeclare queue with args into a
// *QueueMismatchError; it returns nil for any other error.
func queueMismatch(queue string, args amqp091.Table, err error) *QueueMismatchError {
	var amqpErr *amqp091.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp091.PreconditionFailed {
		return nil
	}
	m := inequivalentArg.FindStringSubmatch(amqpErr.Reason)
	if m == nil {
		return nil
	}
	e := &QueueMismatchError{Queue: queue, Argument: m[1], Reason: amqpErr.Reason}
	if v, ok := args[e.Argument]; ok {
		e.Want = fmt.Sprint(v)
	}
	// "… received 'quorum' but current is 'classic'", "… but current is the value '5' of type
	// 'long'", "… but current is none".
	if _, current, ok := strings.Cut(amqpErr.Reason, " but current is "); ok {
		if v := quotedValue.FindStringSubmatch(current); v != nil && !strings.HasPrefix(current, "none") {
			e.Have = v[1]
		}
	}
	return e
}

// declareQueue declares a projection's queue with the arguments of Config.QueueType and returns
// the arguments it was declared with. A quorum queue declared without a delivery limit (on
// RabbitMQ 3, where none is set by default, or by an older version of this package) and met on
// RabbitMQ 4 cannot take the -1 that lifts the new default limit: the queue is declared as it
// is, and a warning says how to lift its limit.
func (c *Channel) declareQueue(name string) (amqp091.Table, error) {
	args := queueArguments(c.cfg.QueueType, c.serverMajor)
	err := c.initialize(c.projectionConfigWith(name, args), c.triggerTopic, c.QueueName(name), c.declareLog(name))
	var mismatch *QueueMismatchError
	if !errors.As(err, &mismatch) || mismatch.Argument != argDeliveryLimit || mismatch.Have != "" {
		return args, err
	}
	args = queueArguments(c.cfg.QueueType, 0)
	if err := c.initialize(c.projectionConfigWith(name, args), c.triggerTopic, mismatch.Queue, c.declareLog(name)); err != nil {
		return nil, err
	}
	c.log.Warn("amqp: the projection's quorum queue has no delivery limit argument (declared before RabbitMQ 4): "+
		"RabbitMQ 4 drops a trigger nacked more often than its default limit of 20 (the safety net makes up for it later); "+
		"to lift the limit, apply a policy with delivery-limit -1 to the queue, or delete the queue and start the worker again",
		slog.String("projection", name), slog.String("queue", mismatch.Queue))
	return args, nil
}

// projectionConfigWith is the subscriber config of one projection's queue with args.
func (c *Channel) projectionConfigWith(name string, args amqp091.Table) amqp.Config {
	cfg := amqp.NewDurablePubSubConfig("", amqp.GenerateQueueNameTopicNameWithSuffix(name))
	cfg.Queue.Arguments = args
	cfg.Marshaler = marshaler{}
	if _, ok := c.unitOf(name); ok {
		cfg.TopologyBuilder = unitTopology{c: c, name: name}
	}
	return cfg
}
