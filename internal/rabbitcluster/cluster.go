package rabbitcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
)

// Cluster is a RabbitMQ cluster of private nodes on this machine, sharing one Erlang cookie.
type Cluster struct {
	// Nodes are the cluster's nodes; every other node joined Nodes[0].
	Nodes []*Node
}

// NewCluster starts size private nodes at once, named opts.Name (or "nudge-rabbit-" and a
// random suffix) and "-1", "-2", …, with opts.Cookie (or a random one) for all, and joins every
// other node to the first. Remove the cluster when done; on an error nothing is left behind.
func NewCluster(ctx context.Context, size int, opts Options) (*Cluster, error) {
	if size < 1 {
		return nil, fmt.Errorf("rabbitcluster: a cluster of %d nodes: at least one is needed", size)
	}
	base := cmp.Or(opts.Name, dirPrefix+randomHex(4))
	opts.Cookie = cmp.Or(opts.Cookie, randomHex(16))
	c := &Cluster{Nodes: make([]*Node, size)}
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i := range size {
		o := opts
		o.Name = base + "-" + strconv.Itoa(i+1)
		wg.Go(func() { c.Nodes[i], errs[i] = Start(ctx, o) })
	}
	wg.Wait()
	err := errors.Join(errs...)
	for _, n := range c.Nodes[1:] {
		if err != nil {
			break
		}
		err = n.Join(ctx, c.Nodes[0])
	}
	if err != nil {
		c.Remove()
		return nil, err
	}
	return c, nil
}

// Join makes n a member of seed's cluster with rabbitmqctl stop_app, join_cluster and
// start_app, as RabbitMQ's clustering guide does it. n takes the cluster's state: join a node
// that holds nothing to keep (a fresh node needs no reset first).
func (n *Node) Join(ctx context.Context, seed *Node) error {
	for _, args := range [][]string{{"stop_app"}, {"join_cluster", seed.Name()}, {"start_app"}} {
		if _, err := n.Ctl(ctx, args...); err != nil {
			return fmt.Errorf("rabbitcluster: join %s to %s: %w", n.name, seed.name, err)
		}
	}
	return n.awaitAMQP(ctx)
}

// Remove kills every node of the cluster and deletes their directories.
func (c *Cluster) Remove() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		if n != nil {
			wg.Go(n.Remove)
		}
	}
	wg.Wait()
}
