package nudge_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// TestClientWithoutChannel: a process that only appends, reads and reports status beside a
// worker that Runs (an API) needs no channel, so no broker connection: it migrates, prepares,
// appends, reads and reports status, and the worker's relay triggers what it appended. Running
// it is refused with ErrNoChannel.
func TestClientWithoutChannel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	logger := testlog.New(t)
	api, err := nudge.New(db.Pool, nudge.Config{Projections: []*projection.Projection{ticketList(t)}, Logger: logger})
	require.NoError(t, err, "no channel")
	require.NoError(t, api.Migrate(ctx))
	require.NoError(t, api.Prepare(ctx))
	require.Nil(t, api.Relay(), "the workers' relays publish the triggers")
	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	_, err = api.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	require.Eventually(t, func() bool { // once no transaction of the cluster holds readers back
		events, err := api.Store().Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		require.NoError(t, err)
		return len(events) == 1
	}, eventually, 5*time.Millisecond, "the append is readable")
	st, err := api.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Zero(t, st.EventsProcessed, "not projected: no worker runs")

	require.ErrorIs(t, api.Run(ctx), nudge.ErrNoChannel)
	require.ErrorIs(t, api.RunBackground(ctx), nudge.ErrNoChannel)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	require.ErrorIs(t, api.AddHandlers(ctx, router), nudge.ErrNoChannel)
	require.ErrorIs(t, api.RunRouter(ctx, router), nudge.ErrNoChannel)
	_, err = nudge.New(db.Pool, nudge.Config{Projections: []*projection.Projection{ticketList(t)}, Triggers: nudge.TriggersInTransaction})
	require.ErrorIs(t, err, nudge.ErrInvalidConfig, "triggers in the append's transaction need the channel")

	// A worker beside it, on a channel.
	ch, err := pgchannel.New(db.Pool, pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	start(t, db.Pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{ticketList(t)}, Logger: logger, SafetyNetInterval: -1}, false)
	data, err = eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "2", Type: "question"})
	require.NoError(t, err)
	_, err = api.Append(ctx, "ticket-2", eventstore.NoStream, data)
	require.NoError(t, err)
	require.NoError(t, api.WaitCaughtUp(testwait.Context(t, time.Minute)), "the worker's relay triggered the API's appends")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ticket_list`).Scan(&n))
	require.Equal(t, 2, n)
}

// TestMigrateAsLeastPrivilegeRole: a service whose role may only read and write nudge's tables
// (pgtest.LeastPrivilegeGrants) calls Client.Migrate at every start, as the README wires it:
// once the tables' owner has migrated, it finds nothing to do; the service then prepares,
// appends and reports status. Before that migration it says what to do.
func TestMigrateAsLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	logger := testlog.New(t)
	list, err := projection.New("ticket_list", projection.Config{},
		projection.On("TicketRegistered", func(context.Context, pgx.Tx, projection.Event[ticketRegistered]) error { return nil }))
	require.NoError(t, err)
	cfg := nudge.Config{Projections: []*projection.Projection{list}, Logger: logger}

	early, err := nudge.New(db.LeastPrivilegePool(t, ""), cfg)
	require.NoError(t, err)
	err = early.Migrate(ctx)
	require.ErrorIs(t, err, postgres.ErrPrivilege, "nothing migrated yet, and the role may not")
	require.ErrorContains(t, err, "run Migrate once as the role that owns nudge's tables")

	owner, err := nudge.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, owner.Migrate(ctx), "the deploy migrates as the owner")

	client, err := nudge.New(db.LeastPrivilegePool(t, ""), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Migrate(ctx), "nothing to migrate")
	require.NoError(t, client.Prepare(ctx))
	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	_, err = client.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	_, err = client.Status(ctx, "ticket_list")
	require.NoError(t, err)
}

// TestRunRouter: RunRouter runs a router of the service's own and the client's background
// together: Running is closed once the router runs; when a part of the background fails, the
// router stops too and the error comes back; a router that stops by itself stops the
// background and returns ErrRouterStopped; the context's end stops both cleanly.
func TestRunRouter(t *testing.T) {
	t.Parallel()
	newRouter := func(t *testing.T, client *nudge.Client) *message.Router {
		router, err := message.NewRouter(message.RouterConfig{}, worker.RouterLogger(watermill.NopLogger{}))
		require.NoError(t, err)
		require.NoError(t, client.AddHandlers(context.Background(), router))
		return router
	}
	t.Run("context ends", func(t *testing.T) {
		t.Parallel()
		client := newMemoryClient(t, nudge.Config{})
		router := newRouter(t, client)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- client.RunRouter(ctx, router) }()
		<-client.Running()
		require.True(t, router.IsRunning())
		cancel()
		require.NoError(t, <-done)
		require.True(t, router.IsClosed())
		require.ErrorIs(t, client.RunRouter(context.Background(), router), nudge.ErrRunTwice)
	})
	t.Run("a part fails", func(t *testing.T) {
		t.Parallel()
		client := newMemoryClient(t, nudge.Config{})
		router := newRouter(t, client)
		// The relay runs already (here, by the test): the client's own run of it fails.
		relayCtx, stopRelay := context.WithCancel(context.Background())
		relayDone := make(chan error, 1)
		go func() { relayDone <- client.Relay().Run(relayCtx) }()
		t.Cleanup(func() { stopRelay(); require.NoError(t, <-relayDone) })
		require.Eventually(t, func() bool {
			_, err := client.Relay().Status(context.Background())
			return err == nil
		}, eventually, 5*time.Millisecond, "the relay is registered")
		err := client.RunRouter(testwait.Context(t, time.Minute), router)
		require.ErrorIs(t, err, projection.ErrAlreadyRunning)
		require.ErrorContains(t, err, "relay")
		require.True(t, router.IsClosed(), "the router stopped with it")
	})
	t.Run("router stops", func(t *testing.T) {
		t.Parallel()
		client := newMemoryClient(t, nudge.Config{})
		router := newRouter(t, client)
		done := make(chan error, 1)
		go func() { done <- client.RunRouter(testwait.Context(t, time.Minute), router) }()
		<-client.Running()
		require.NoError(t, router.Close())
		require.ErrorIs(t, <-done, nudge.ErrRouterStopped, "the background stopped with it")
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		client := newMemoryClient(t, nudge.Config{})
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		require.ErrorIs(t, client.RunRouter(context.Background(), router), nudge.ErrInvalidConfig, "AddHandlers never saw it")
		require.ErrorIs(t, client.RunRouter(context.Background(), nil), nudge.ErrInvalidConfig)
		require.ErrorIs(t, client.AddHandlers(context.Background(), nil), nudge.ErrInvalidConfig)
	})
}
