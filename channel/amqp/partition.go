package amqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
)

// Routing of triggers to partition units.
//
// A partition unit's queue is bound to the partitions exchange (p + "nudge.triggers.partitions",
// a topic exchange that the fanout exchange feeds through an exchange-to-exchange binding), not
// to the fanout exchange: it receives only the triggers whose partition keys fall in its
// partition, and those without keys. A trigger with keys is published to the fanout exchange
// once, with one routing key per key in its CC header (RabbitMQ's sender-selected
// distribution); the fanout exchange ignores them (every projection's queue gets the trigger,
// as before) and passes them on to the partitions exchange, which matches them against the
// units' bindings. A trigger without keys goes out with the routing key "", which every unit
// binds: so does one published by an older version of this package.
//
// The routing key of a partition key k lists, for each prime p up to 31, the first base-p digits
// of k (least significant first) up to the largest power of p within eventstore.MaxPartitions:
// k mod p^a is fixed by its first a digits. Partition i of a count c whose prime factors are all
// up to 31 binds a pattern fixing, for each p^a dividing c, the first a digits of i mod p^a, and
// "*" for every other digit: by the Chinese remainder theorem the key matches exactly when k mod
// c is i. The publisher needs to know no count. A unit of a count with a larger prime factor
// binds "#" and receives every trigger, as a projection's queue does; its consumer ignores those
// of other partitions (trigger.Trigger.ConcernsPartition), as every unit's consumer does anyway.

// routingSections are the primes of the routing keys with each one's number of digits: the
// largest a with p^a at most eventstore.MaxPartitions.
var routingSections = func() []routingSection {
	var out []routingSection
	for _, p := range []int{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31} {
		s := routingSection{prime: p}
		for pow := p; pow <= eventstore.MaxPartitions; pow *= p {
			s.digits++
		}
		out = append(out, s)
	}
	return out
}()

type routingSection struct{ prime, digits int }

// keyedRoutingKey is the routing key of a publish whose CC header carries the partition keys'
// routing keys: no unit binds it (a "#" binding matches it, as it matches everything).
const keyedRoutingKey = "keyed"

// routingKey returns the routing key of partition key k.
func routingKey(k uint32) string {
	var b strings.Builder
	for _, s := range routingSections {
		v := uint64(k)
		for range s.digits {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(strconv.FormatUint(v%uint64(s.prime), 10))
			v /= uint64(s.prime)
		}
	}
	return b.String()
}

// bindingKey returns the pattern that partition index of count binds on the partitions
// exchange: "#" when count has a prime factor above the sections' (every trigger).
func bindingKey(index, count int) string {
	rest := count
	var words []string
	for _, s := range routingSections {
		a := 0
		for rest%s.prime == 0 {
			rest /= s.prime
			a++
		}
		v := index
		for d := range s.digits {
			if d < a {
				words = append(words, strconv.Itoa(v%s.prime))
				v /= s.prime
				continue
			}
			words = append(words, "*")
		}
	}
	if rest != 1 {
		return "#"
	}
	return strings.Join(words, ".")
}

// routingKeys returns the distinct routing keys of keys.
func routingKeys(keys []uint32) []any {
	seen := make(map[string]bool, len(keys))
	out := make([]any, 0, len(keys))
	for _, k := range keys {
		if rk := routingKey(k); !seen[rk] {
			seen[rk] = true
			out = append(out, rk)
		}
	}
	return out
}

// unitPartition is the partition a unit's queue consumes: Index of Count.
type unitPartition struct{ Index, Count int }

// partitionExchange is the name of the partitions exchange.
func (c *Channel) partitionExchange() string { return c.triggerTopic + ".partitions" }

var _ channel.PartitionDeclarer = (*Channel)(nil)

// DeclarePartitions implements channel.PartitionDeclarer: it declares the queues of one
// partitioned projection's units, units[k] being partition k of len(units), each bound to the
// partitions exchange so that it receives only the triggers of its partition and those
// without partition keys. A unit queue that an older version bound to the fanout exchange
// loses that binding when this Channel's subscriber of it subscribes.
func (c *Channel) DeclarePartitions(ctx context.Context, units ...string) error {
	if len(units) < 2 || len(units) > eventstore.MaxPartitions {
		return fmt.Errorf("%w: DeclarePartitions takes 2 to %d units, got %d", ErrInvalidConfig, eventstore.MaxPartitions, len(units))
	}
	for _, unit := range units {
		if err := name.Validate(unit); err != nil {
			return err
		}
	}
	for k, unit := range units {
		c.partitions.Store(unit, unitPartition{Index: k, Count: len(units)})
	}
	// Every worker of the projection declares its units at start: a unit whose queue exists
	// was declared with its bindings by an earlier declaration (or bound to the fanout
	// exchange by an earlier version: it then receives every trigger, and its subscriber
	// moves it), so only the missing ones are declared, and the first unit, which checks that
	// the existing queues' kind is the one configured (*QueueMismatchError). Looking a queue up
	// costs the broker a read, declaring it and its two bindings three transactions.
	missing, err := c.missingQueues(ctx, units[1:])
	if err != nil {
		return c.declareAll(ctx, units)
	}
	if err := c.declareAll(ctx, append([]string{units[0]}, missing...)); err != nil {
		return err
	}
	args := queueArguments(c.cfg.QueueType, c.serverMajor)
	if first, ok := c.declared.Load(units[0]); ok {
		args = first.(amqp091.Table)
	}
	for _, unit := range units[1:] {
		if _, ok := c.declared.Load(unit); !ok {
			c.declared.Store(unit, args)
		}
	}
	return nil
}

// lookupChannels is how many AMQP channels missingQueues looks queues up on at once.
const lookupChannels = 8

// missingQueues returns the names whose queues do not exist, looked up (passive declares) on
// lookupChannels channels at once.
func (c *Channel) missingQueues(ctx context.Context, names []string) ([]string, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	exists := make([]bool, len(names))
	errs := make([]error, lookupChannels)
	var wg sync.WaitGroup
	for w := range lookupChannels {
		wg.Go(func() {
			l := lookup{c: c}
			defer l.close()
			for i := w; i < len(names) && errs[w] == nil; i += lookupChannels {
				exists[i], errs[w] = l.exists(ctx, names[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var missing []string
	for i, ok := range exists {
		if !ok {
			missing = append(missing, names[i])
		}
	}
	return missing, nil
}

// lookup looks queues up on one AMQP channel, opened again after each queue the broker did
// not find (it closes the channel then).
type lookup struct {
	c  *Channel
	ch *amqp091.Channel
}

// exists reports whether the named projection's or unit's queue exists.
func (l *lookup) exists(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if l.ch == nil {
		ch, err := l.c.conn.Connection().Channel()
		if err != nil {
			return false, err
		}
		l.ch = ch
	}
	_, err := l.ch.QueueDeclarePassive(l.c.QueueName(name), true, false, false, false, nil)
	var amqpErr *amqp091.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp091.NotFound:
		l.ch = nil
		return false, nil
	}
	return false, err
}

// close closes the channel, if open.
func (l *lookup) close() {
	if l.ch != nil {
		_ = l.ch.Close()
	}
}

// unitOf returns the partition of the unit name declared with DeclarePartitions.
func (c *Channel) unitOf(name string) (unitPartition, bool) {
	v, ok := c.partitions.Load(name)
	if !ok {
		return unitPartition{}, false
	}
	return v.(unitPartition), true
}

// binding is one binding of a queue: to exchange with key.
type binding struct{ exchange, key string }

// bindings returns the bindings of the named projection's or unit's queue.
func (c *Channel) bindings(name string) []binding {
	part, ok := c.unitOf(name)
	if !ok {
		return []binding{{exchange: c.triggerTopic}}
	}
	return []binding{{exchange: c.partitionExchange()}, {exchange: c.partitionExchange(), key: bindingKey(part.Index, part.Count)}}
}

// declareExchanges declares the fanout exchange and, with partitions, the partitions exchange
// fed by it.
func (c *Channel) declareExchanges(ch *amqp091.Channel, partitions bool) error {
	if err := ch.ExchangeDeclare(c.triggerTopic, "fanout", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", c.triggerTopic, err)
	}
	if !partitions {
		return nil
	}
	if err := ch.ExchangeDeclare(c.partitionExchange(), "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", c.partitionExchange(), err)
	}
	if err := ch.ExchangeBind(c.partitionExchange(), "#", c.triggerTopic, false, nil); err != nil {
		return fmt.Errorf("bind exchange %s to %s: %w", c.partitionExchange(), c.triggerTopic, err)
	}
	return nil
}

// unitTopology is the TopologyBuilder of a partition unit's subscriber: it declares the queue
// and the exchanges and binds the queue to the partitions exchange, and unbinds it from the
// fanout exchange (a binding an older version made).
type unitTopology struct {
	amqp.DefaultTopologyBuilder
	c    *Channel
	name string
}

// BuildTopology implements amqp.TopologyBuilder.
func (t unitTopology) BuildTopology(ch *amqp091.Channel, queue, _ string, cfg amqp.Config, _ watermill.LoggerAdapter) error {
	if _, err := ch.QueueDeclare(queue, cfg.Queue.Durable, cfg.Queue.AutoDelete, cfg.Queue.Exclusive, false, cfg.Queue.Arguments); err != nil {
		return fmt.Errorf("cannot declare queue: %w", err)
	}
	if err := t.c.declareExchanges(ch, true); err != nil {
		return err
	}
	for _, b := range t.c.bindings(t.name) {
		if err := ch.QueueBind(queue, b.key, b.exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s: %w", queue, b.exchange, err)
		}
	}
	if err := ch.QueueUnbind(queue, "", t.c.triggerTopic, nil); err != nil {
		return fmt.Errorf("unbind queue %s from %s: %w", queue, t.c.triggerTopic, err)
	}
	return nil
}
