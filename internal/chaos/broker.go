package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/internal/redact"
)

// broker is this run's share of the shared RabbitMQ: names under one prefix per scenario, and
// outages that only the connections named with that prefix see (the broker itself is never
// restarted: other people's tests use it).
type broker struct {
	url string
}

// amqpURLDefault is the broker used when NUDGE_TEST_AMQP_URL is not set.
const amqpURLDefault = "amqp://guest:guest@127.0.0.1:5672/"

func newBroker() *broker {
	u := os.Getenv("NUDGE_TEST_AMQP_URL")
	if u == "" {
		u = amqpURLDefault
	}
	return &broker{url: u}
}

// ping checks that the broker answers.
func (b *broker) ping() error {
	conn, err := b.dial("nudge_chaos.check")
	if err != nil {
		return fmt.Errorf("RabbitMQ at %s is not reachable: %s; start it with `make up`", redact.URL(b.url), redact.Message(err.Error(), b.url))
	}
	return conn.Close()
}

func (b *broker) dial(name string) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	return amqp091.DialConfig(b.url, amqp091.Config{Properties: props, Dial: amqp091.DefaultDial(5 * time.Second)})
}

// rabbitmqctl runs RabbitMQ's CLI (NUDGE_TEST_RABBITMQCTL, else rabbitmqctl).
func rabbitmqctl(ctx context.Context, args ...string) (string, error) {
	command := strings.Fields(os.Getenv("NUDGE_TEST_RABBITMQCTL"))
	if len(command) == 0 {
		command = []string{"rabbitmqctl"}
	}
	ctx, cancel := context.WithTimeout(ctx, deadline(30*time.Second))
	defer cancel()
	cmd := exec.CommandContext(ctx, command[0], append(command[1:], args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// closeConnectionsErlang makes the broker close every connection whose name starts with the
// prefix (~s) and prints how many it closed: one rabbitmqctl call (an Erlang VM start, seconds
// on a loaded machine) instead of a listing and one call per connection.
const closeConnectionsErlang = `Prefix = <<"~s">>,
Ps = [P || P <- rabbit_networking:connections(),
	[{client_properties, Props}] <- [catch rabbit_networking:connection_info(P, [client_properties])],
	{_, longstr, N} <- [lists:keyfind(<<"connection_name">>, 1, Props)],
	binary:longest_common_prefix([N, Prefix]) =:= byte_size(Prefix)],
[catch rabbit_networking:close_connection(P, "nudge chaos: connection cut") || P <- Ps],
length(Ps).`

// safePrefix matches the prefixes the suite builds, so one can go into Erlang code as is.
var safePrefix = regexp.MustCompile(`^[a-zA-Z0-9_.-]+$`)

// closeConnections makes the broker close every connection whose name starts with prefix, as
// a broker restart would (connection.close with CONNECTION_FORCED), and returns how many, and
// when it started closing them.
func (b *broker) closeConnections(ctx context.Context, prefix string) (int, time.Time, error) {
	if !safePrefix.MatchString(prefix) {
		return 0, time.Time{}, fmt.Errorf("close connections: unexpected prefix %q", prefix)
	}
	issued := time.Now()
	out, err := rabbitmqctl(ctx, "eval", strings.ReplaceAll(closeConnectionsErlang, "~s", prefix))
	if err != nil {
		return 0, issued, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return 0, issued, fmt.Errorf("close connections: unexpected answer %q", cut(strings.TrimSpace(out), 200))
	}
	return n, issued, nil
}

// queueNames lists the queues of the vhost whose names start with prefix.
func (b *broker) queueNames(ctx context.Context, prefix string) ([]string, error) {
	out, err := rabbitmqctl(ctx, "list_queues", "-q", "--no-table-headers", "name")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Split(out, "\n") {
		if n = strings.TrimSpace(n); strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names, nil
}

// queueName is the queue of a projection under prefix, as channel/amqp names it.
func queueName(prefix, projection string) string {
	return prefix + channel.TriggerTopic + "_" + projection
}

// deleteTopology deletes the exchange and queues a scenario declared under prefix.
func (b *broker) deleteTopology(prefix string, projections []string) error {
	queues := make([]string, len(projections))
	for i, p := range projections {
		queues[i] = queueName(prefix, p)
	}
	exchanges := []string{prefix + channel.TriggerTopic, prefix + channel.TriggerTopic + ".partitions"}
	// A busy broker may drop the connection of a long clean-up (thousands of queues): dial
	// again and go on, a few times.
	var err error
	for range 5 {
		if queues, err = b.deleteSome(prefix, queues, exchanges); err == nil {
			return nil
		}
	}
	return err
}

// deleteSome deletes queues and then exchanges (deleting one that does not exist is no
// error) on one connection; it returns the queues it did not delete when it fails.
func (b *broker) deleteSome(prefix string, queues, exchanges []string) ([]string, error) {
	conn, err := b.dial(prefix + "cleanup")
	if err != nil {
		return queues, fmt.Errorf("delete the queues of %s: %s", prefix, redact.Message(err.Error(), b.url))
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return queues, err
	}
	for i, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return queues[i:], fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return nil, fmt.Errorf("delete exchange %s: %w", x, err)
		}
	}
	return nil, nil
}

// rawMessage is a message published straight to a queue, bypassing the channel.
type rawMessage struct {
	// UUID goes into Watermill's message-UUID header; empty leaves the header out.
	UUID string
	Body []byte
}

// publishRaw publishes msgs to queue through the default exchange, with publisher confirms.
func (b *broker) publishRaw(ctx context.Context, connName, queue string, msgs []rawMessage) error {
	conn, err := b.dial(connName)
	if err != nil {
		return fmt.Errorf("publish to %s: %s", queue, redact.Message(err.Error(), b.url))
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	for _, m := range msgs {
		pub := amqp091.Publishing{Body: m.Body, DeliveryMode: amqp091.Persistent}
		if m.UUID != "" {
			pub.Headers = amqp091.Table{"_watermill_message_uuid": m.UUID}
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
		if err != nil {
			return fmt.Errorf("publish to %s: %w", queue, err)
		}
		ok, err := conf.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("publish to %s: the broker nacked the message", queue)
		}
	}
	return nil
}

// survivorQueue is a durable queue bound to the scenario's trigger exchange that nobody
// consumes: it collects a persistent copy of every trigger, so its message count shows that
// queues, bindings and persistent messages survive a broker restart.
func survivorQueue(prefix string) string { return prefix + "survivor" }

// declareSurvivor declares the survivor queue and binds it to the trigger exchange.
func (b *broker) declareSurvivor(prefix string) error {
	conn, err := b.dial(prefix + "survivor")
	if err != nil {
		return fmt.Errorf("declare the survivor queue: %s", redact.Message(err.Error(), b.url))
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(survivorQueue(prefix), true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(survivorQueue(prefix), "", prefix+channel.TriggerTopic, false, nil)
}

// queueDepths returns the number of ready messages of each queue (a passive declare, which
// fails if the queue does not exist).
func (b *broker) queueDepths(names ...string) (map[string]int, error) {
	conn, err := b.dial("nudge_chaos.depth")
	if err != nil {
		return nil, fmt.Errorf("count the messages: %s", redact.Message(err.Error(), b.url))
	}
	defer func() { _ = conn.Close() }()
	out := map[string]int{}
	for _, name := range names {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return nil, fmt.Errorf("queue %s: %w", name, err)
		}
		out[name] = q.Messages
		_ = ch.Close()
	}
	return out, nil
}
