// Package channel carries triggers from where events are appended to one subscription per
// projection, through a broker. Backends are subpackages: channel/amqp (RabbitMQ),
// channel/postgres (PostgreSQL queue tables) and channel/gochannel (in process, for the
// embedded demo and tests). All of them pass the suite in channel/channeltest.
//
// Every projection has a subscription of its own (a durable queue, a table, a GoChannel
// subscription), so a projection that fails forever never holds back another one's triggers.
// Topology names derive from projection names, which name.Validate has checked:
// nothing else reaches SQL or the broker.
package channel

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge/trigger"
)

// Channel is one broker's wiring for triggers.
type Channel interface {
	// Declare creates the subscriptions of the named projections, so that every trigger
	// published after Declare returns reaches each of them (on durable channels even if no
	// consumer runs yet). It is idempotent and refuses invalid names.
	Declare(ctx context.Context, projections ...string) error
	// Publish sends t to every declared projection, or, when t.Projection is set, to that
	// projection's subscription (non-durable channels may deliver it to all; consumers ignore
	// triggers addressed to another projection). Publish never creates a subscription: durable
	// channels refuse a trigger addressed to a projection that no process has declared, rather
	// than keep it where nobody reads it.
	Publish(ctx context.Context, t trigger.Trigger) error
	// Subscriber returns the subscriber and topic a handler of the projection consumes.
	Subscriber(projection string) (message.Subscriber, string, error)
	// Publisher returns the channel's raw publisher: it publishes messages as they are (which
	// may not be triggers at all) to the topic a projection's Subscriber consumes.
	Publisher() message.Publisher
	// Durable reports whether published triggers survive a restart of the consumer (and of the
	// broker): true for RabbitMQ and PostgreSQL, false for GoChannel.
	Durable() bool
	// Close closes the channel's publishers, subscribers and connections.
	Close() error
}

// Undeclarer is implemented by the durable channels (channel/amqp, channel/postgres):
// Undeclare deletes the named projections' subscriptions and the triggers queued there, so
// publishers stop keeping triggers for a projection that no worker runs any more (a version
// replaced by a newer one, a projection deleted). On such a subscription every trigger
// published waits for the disk and stays for good. Declaring a projection again creates its
// subscription anew. The worker of a projection's active version undeclares the
// subscriptions of the versions it replaced.
//
// A subscription that a process still consumes may be kept: Undeclare then fails with an
// error matching ErrInUse (RabbitMQ does not delete a queue with a consumer).
type Undeclarer interface {
	Undeclare(ctx context.Context, projections ...string) error
}

// PartitionDeclarer is implemented by channels that deliver to a partition unit's
// subscription only the triggers whose partition keys (trigger.Trigger.Keys) fall in its
// partition, and those without keys (channel/amqp). DeclarePartitions declares the
// subscriptions of one partitioned projection's units, units[k] being partition k of
// len(units) (projection.Runner.Partitions lists them in that order); it replaces Declare for
// them. A worker uses it when its channel has it. Consumers still check every trigger
// (trigger.Trigger.ConcernsPartition): the routing saves them the work, it is not what keeps
// a partition's triggers apart.
type PartitionDeclarer interface {
	DeclarePartitions(ctx context.Context, units ...string) error
}

// ErrInUse matches an Undeclare that kept a subscription because a process still consumes it.
var ErrInUse = errors.New("channel: subscription in use")

// TriggerTopic is the fan-out topic (exchange, prefix) for triggers, the name every backend uses.
const TriggerTopic = "nudge.triggers"
