package amqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/internal/rabbitcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/trigger"
)

// TestTwoNodeCluster runs the channel on a cluster of two private RabbitMQ nodes with quorum
// queues:
//
//   - the topology declared through node 1 (the fanout exchange, a quorum queue per projection,
//     their bindings and arguments) is listed identically by both nodes, and each queue has a
//     member on both, online;
//   - a channel on node 2 declares the same projections (the broker finds the arguments
//     equivalent) and a trigger it publishes reaches a subscriber on node 1;
//   - after a graceful stop of node 2 the queues have one member of two online, which is no
//     quorum: a publish through node 1 is not confirmed and nothing is delivered while node 2
//     is away. Once node 2 is back, the same publish is confirmed and its trigger delivered:
//     nothing was lost, but two nodes are less available than one. Hence RabbitMQ's guidance
//     of three or five nodes for quorum queues (docs/operations/pgbouncer-and-sizing.md).
func TestTwoNodeCluster(t *testing.T) {
	t.Parallel()
	c := rabbitcluster.ForTest(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := testwait.Context(t, 10*time.Minute) // a bound for a failure: CLI commands take seconds to a minute
	cfg := amqp.Config{
		URL: n1.URL(), QueueType: amqp.QueueQuorum, Logger: newLogs(t).logger(),
		StartupTimeout: eventually, ReconnectMaxInterval: time.Second,
	}
	ch1 := newChannel(t, cfg)
	projections := []string{"alpha", "beta"}
	require.NoError(t, ch1.Declare(ctx, projections...))

	var tops [2]clusterTopology
	var errs [2]error
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { tops[i], errs[i] = listTopology(ctx, n) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs[:]...))
	require.Equal(t, tops[0].raw, tops[1].raw, "the topology as node 1 and node 2 list it")
	members := []string{n1.Name(), n2.Name()}
	slices.Sort(members)
	requireNudgeTopology(t, tops[1], ch1, projections, members)

	msgs := subscribe(t, ch1, "alpha")
	cfg2 := cfg
	cfg2.URL = n2.URL()
	ch2, err := amqp.New(ctx, cfg2)
	require.NoError(t, err)
	require.NoError(t, ch2.Declare(ctx, projections...), "the same declaration through node 2")
	require.NoError(t, ch2.Publish(ctx, channeltest.Trigger(1)))
	requireTrigger(t, msgs, 1)
	require.NoError(t, ch2.Close())

	// One of two members is no majority: the queues stop serving until node 2 is back.
	require.NoError(t, n2.Stop(ctx))
	published := make(chan error, 1)
	go func() { published <- ch1.Publish(ctx, channeltest.Trigger(2)) }()
	require.Equal(t, map[string]bool{n1.Name(): true, n2.Name(): false}, quorumOnline(t, ctx, n1, ch1.QueueName("alpha")),
		"the members online with node 2 stopped")
	select {
	case err := <-published:
		t.Fatalf("a publish was answered (%v) with one of two quorum queue members online", err)
	case msg := <-msgs:
		t.Fatalf("a trigger was delivered with one of two quorum queue members online: %s", msg.Payload)
	default:
	}
	require.NoError(t, n2.Start(ctx))
	select {
	case err := <-published:
		require.NoError(t, err, "the publish made while node 2 was away, once it is back")
	case <-time.After(eventually):
		t.Fatalf("the publish made while node 2 was away is not confirmed %s after it came back", eventually)
	}
	requireTrigger(t, msgs, 2)
}

// requireTrigger requires the next message on msgs to be the trigger of position n, and acks it.
func requireTrigger(t *testing.T, msgs <-chan *message.Message, n int64) {
	t.Helper()
	msg := nextMessage(t, msgs)
	tr, err := trigger.FromMessage(msg)
	require.NoError(t, err)
	require.Equal(t, n, tr.Position.GlobalPosition)
	msg.Ack()
}

// quorumOnline returns, from rabbitmq-queues quorum_status through n, whether each member of
// a quorum queue is online (not "nodedown").
func quorumOnline(t *testing.T, ctx context.Context, n *rabbitcluster.Node, queue string) map[string]bool {
	t.Helper()
	out, err := n.Queues(ctx, "quorum_status", queue, "--quiet", "--formatter", "json")
	require.NoError(t, err)
	var members []struct {
		Node  string          `json:"Node Name"`
		State json.RawMessage `json:"Raft State"` // "leader", "follower", …, or ["nodedown", node]
	}
	require.NoError(t, json.Unmarshal([]byte(out), &members), out)
	online := map[string]bool{}
	for _, m := range members {
		online[m.Node] = !strings.Contains(string(m.State), "nodedown")
	}
	return online
}

// clusterTopology is what a node lists of the broker's queues, exchanges and bindings.
type clusterTopology struct {
	raw       map[string][]string // command → its JSON rows, each re-encoded, sorted
	queues    []clusterQueue
	exchanges []clusterExchange
	bindings  []clusterBinding
}

type clusterQueue struct {
	Name      string  `json:"name"`
	Type      string  `json:"type"`
	Durable   bool    `json:"durable"`
	Arguments [][]any `json:"arguments"` // [name, type, value]
	Members   []string
	Online    []string
	Leader    string
}

type clusterExchange struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Durable bool   `json:"durable"`
}

type clusterBinding struct {
	Source          string `json:"source_name"`
	Destination     string `json:"destination_name"`
	DestinationKind string `json:"destination_kind"`
	RoutingKey      string `json:"routing_key"`
}

// The rabbitmqctl listings compared across nodes.
var topologyListings = map[string][]string{
	"list_queues":    {"name", "type", "durable", "auto_delete", "exclusive", "arguments", "members", "online", "leader"},
	"list_exchanges": {"name", "type", "durable", "auto_delete", "internal", "arguments"},
	"list_bindings":  {"source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"},
}

// listTopology lists the queues, exchanges and bindings of the default vhost through n.
func listTopology(ctx context.Context, n *rabbitcluster.Node) (clusterTopology, error) {
	top := clusterTopology{raw: map[string][]string{}}
	for command, columns := range topologyListings {
		out, err := n.Ctl(ctx, append([]string{command, "--quiet", "--formatter", "json"}, columns...)...)
		if err != nil {
			return top, err
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			return top, fmt.Errorf("%s through %s: %w: %s", command, n.Name(), err, out)
		}
		for _, row := range rows {
			text, err := json.Marshal(row) // with its keys sorted
			if err != nil {
				return top, err
			}
			top.raw[command] = append(top.raw[command], string(text))
		}
		slices.Sort(top.raw[command])
		var into any
		switch command {
		case "list_queues":
			into = &top.queues
		case "list_exchanges":
			into = &top.exchanges
		default:
			into = &top.bindings
		}
		if err := json.Unmarshal([]byte(out), into); err != nil {
			return top, fmt.Errorf("%s through %s: %w: %s", command, n.Name(), err, out)
		}
	}
	return top, nil
}

// queue returns the listed queue of that name.
func (top clusterTopology) queue(t *testing.T, name string) clusterQueue {
	t.Helper()
	i := slices.IndexFunc(top.queues, func(q clusterQueue) bool { return q.Name == name })
	require.GreaterOrEqual(t, i, 0, "queue %s is not listed", name)
	return top.queues[i]
}

// requireNudgeTopology requires the topology the package documents: one durable fanout
// exchange, and per projection a durable quorum queue bound to it, with members online on
// every node of the cluster.
func requireNudgeTopology(t *testing.T, top clusterTopology, ch *amqp.Channel, projections []string, members []string) {
	t.Helper()
	require.Contains(t, top.exchanges, clusterExchange{Name: channel.TriggerTopic, Type: "fanout", Durable: true})
	for _, p := range projections {
		q := top.queue(t, ch.QueueName(p))
		require.Equal(t, "quorum", q.Type, q.Name)
		require.True(t, q.Durable, q.Name)
		require.Contains(t, q.Arguments, []any{"x-queue-type", "longstr", "quorum"}, q.Name)
		slices.Sort(q.Members)
		slices.Sort(q.Online)
		require.Equal(t, members, q.Members, "%s: members", q.Name)
		require.Equal(t, members, q.Online, "%s: members online", q.Name)
		require.Contains(t, members, q.Leader, q.Name)
		require.Contains(t, top.bindings, clusterBinding{Source: channel.TriggerTopic, Destination: q.Name, DestinationKind: "queue"}, q.Name)
	}
}
