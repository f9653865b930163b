package nudge

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// Run runs everything until ctx ends: the projections' handlers on a router of the client's own
// (each with its own subscription, retries and dead letters), the relay (TriggersRelay), the
// replay after deploy, the start-up catch-up and the safety net, and the horizon watch. Then it
// stops them (handlers in flight finish or roll back, within CloseTimeout) and returns nil.
//
// What fails at start is returned at once, before any handler runs: a database where Migrate
// never ran (errors matching projection.ErrNotMigrated, eventstore.ErrNotMigrated or
// deadletter.ErrNotMigrated), an init hook's error, a channel that cannot declare. If a part
// stops with an error while running, Run stops the others and returns it. A Client runs once:
// a second Run returns ErrRunTwice.
func (c *Client) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	if err := c.watchWorker(); err != nil {
		return err
	}
	return notMigratedHint(c.runParts(ctx, c.worker.Run))
}

// notMigratedHint adds to an error that says a table is missing what creates it on this path.
func notMigratedHint(err error) error {
	if errors.Is(err, eventstore.ErrNotMigrated) || errors.Is(err, projection.ErrNotMigrated) || errors.Is(err, deadletter.ErrNotMigrated) {
		return fmt.Errorf("%w (Client.Migrate creates every table nudge uses)", err)
	}
	return err
}

// Prepare registers the projections (their status rows, and their init hooks, which create
// read models) and declares their subscriptions on the channel, so triggers published from
// then on wait for a handler; it runs nothing. A process that appends and serves read models
// and statuses while other processes Run the projections calls it at start, after Migrate;
// Run and AddHandlers prepare by themselves. It is idempotent.
func (c *Client) Prepare(ctx context.Context) error {
	return notMigratedHint(c.worker.Prepare(ctx))
}

// AddHandlers prepares the projections (Prepare) and adds one handler per projection to
// router, a router of yours. Give the router worker.RouterLogger(…) as its logger so its lines
// name the projection. Then run the router and RunBackground.
func (c *Client) AddHandlers(ctx context.Context, router *message.Router) error {
	if err := c.Prepare(ctx); err != nil {
		return err
	}
	if err := c.watchWorker(); err != nil {
		return err
	}
	return c.worker.AddHandlers(router)
}

// RunBackground runs what Run runs besides the handlers, for handlers on your router
// (AddHandlers): the relay, and once the router runs, the replay after deploy, the start-up
// catch-up, the safety net and the horizon watch; until ctx ends. It returns nil then, or the
// error a part stopped with. A Client runs once: a second call returns ErrRunTwice.
func (c *Client) RunBackground(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	return c.runParts(ctx, c.worker.RunBackground)
}

// runParts runs the worker part and the relay until ctx ends or one of them fails. The relay
// starts once the worker's subscriptions are ready, so its first triggers are not published
// where nobody listens yet.
func (c *Client) runParts(ctx context.Context, runWorker func(context.Context) error) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	stop := func(part string, err error) {
		mu.Lock()
		if err != nil && first == nil && parent.Err() == nil {
			first = err
			if part != "" {
				first = fmt.Errorf("nudge: %s: %w", part, err)
			}
		}
		mu.Unlock()
		cancel()
	}
	wg.Go(func() { stop("", runWorker(ctx)) })
	if c.relay != nil {
		wg.Go(func() {
			select {
			case <-c.worker.Running():
				stop("relay", c.relay.Run(ctx))
			case <-ctx.Done():
			}
		})
	}
	if c.listener != nil {
		// It returns nil when ctx ends; meanwhile it reconnects after every loss.
		wg.Go(func() { _ = c.listener.Run(ctx) })
	}
	wg.Wait()
	return first
}
