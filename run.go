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
// a second Run returns ErrRunTwice. A client without a channel returns ErrNoChannel.
//
// Running is closed once the handlers are subscribed.
func (c *Client) Run(ctx context.Context) error {
	if c.cfg.Channel == nil {
		return ErrNoChannel
	}
	if !c.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	if err := c.watchWorker(); err != nil {
		return err
	}
	return notMigratedHint(c.runParts(ctx, c.worker.Run))
}

// ErrRouterStopped is returned by RunRouter when the router stopped (was closed, or every
// handler stopped) before ctx ended, without an error.
var ErrRouterStopped = errors.New("nudge: the router stopped before the context ended: cancel RunRouter's context to stop it")

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
// Run and AddHandlers prepare by themselves. It is idempotent. A client without a channel
// (Config.Channel nil) declares no subscription: the processes that run the projections do,
// before their relays publish.
func (c *Client) Prepare(ctx context.Context) error {
	return notMigratedHint(c.worker.Prepare(ctx))
}

// AddHandlers prepares the projections (Prepare) and adds one handler per projection to
// router, a router of yours. Give the router worker.RouterLogger(…) as its logger so its lines
// name the projection. Then RunRouter runs the router and the rest; or run the router
// yourself, with RunBackground beside it, and stop each when the other returns.
func (c *Client) AddHandlers(ctx context.Context, router *message.Router) error {
	if c.cfg.Channel == nil {
		return ErrNoChannel
	}
	if router == nil {
		return fmt.Errorf("%w: AddHandlers needs a router", ErrInvalidConfig)
	}
	if err := c.Prepare(ctx); err != nil {
		return err
	}
	if err := c.watchWorker(); err != nil {
		return err
	}
	if err := c.worker.AddHandlers(router); err != nil {
		return err
	}
	c.routers.Store(router, true)
	return nil
}

// RunRouter runs router — a router of yours that AddHandlers added the handlers to — and
// RunBackground's parts beside it, until ctx ends; then it stops both (handlers in flight finish
// or roll back, within the router's CloseTimeout) and returns nil. If either stops before ctx
// ends, RunRouter stops the other and returns why: the router's error, a part's error, or
// ErrRouterStopped for a router that closed without one. A service that returns this error
// therefore stops, rather than run on with its projections stalled. Running is closed once the
// router runs. A Client runs once: a second call returns ErrRunTwice.
func (c *Client) RunRouter(ctx context.Context, router *message.Router) error {
	if c.cfg.Channel == nil {
		return ErrNoChannel
	}
	if _, ok := c.routers.Load(router); !ok || router == nil {
		return fmt.Errorf("%w: RunRouter needs a router AddHandlers added the handlers to", ErrInvalidConfig)
	}
	if !c.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	background := make(chan error, 1)
	go func() {
		background <- c.runParts(ctx, c.worker.RunBackground)
		cancel() // it stopped: so does the router
	}()
	err := router.Run(ctx)
	cancel()
	stopped := <-background
	switch {
	case err != nil:
		return fmt.Errorf("nudge: router: %w", err)
	case stopped != nil:
		return stopped
	case parent.Err() == nil:
		return ErrRouterStopped
	}
	return nil
}

// Running is closed once the projections' handlers are subscribed — by Run, or by RunRouter or
// RunBackground once the routers given to AddHandlers run: from then on no trigger is missed,
// and WaitCaughtUp can tell. A readiness probe can wait for it. It is never closed on a client
// that does not run (Prepare, or no channel).
func (c *Client) Running() <-chan struct{} { return c.worker.Running() }

// RunBackground runs what Run runs besides the handlers, for handlers on your router
// (AddHandlers): the relay, and once the router runs, the replay after deploy, the start-up
// catch-up, the safety net and the horizon watch; until ctx ends. It returns nil then, or the
// error a part stopped with. It does not watch your router: when you run the router yourself,
// stop it when RunBackground returns before ctx ends, and stop RunBackground (its ctx) when the
// router stops; RunRouter does both. A Client runs once: a second call returns ErrRunTwice.
func (c *Client) RunBackground(ctx context.Context) error {
	if c.cfg.Channel == nil {
		return ErrNoChannel
	}
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
