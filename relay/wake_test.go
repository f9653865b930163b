package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
)

// TestAppendWakesTheRelay: with its polls an hour apart, an idle relay publishes the trigger of
// an append made after its last poll — by a store the relay does not know, as another process
// would — so the append's notification woke it.
func TestAppendWakesTheRelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, store, backend := newBackend(t)

	listening := make(chan struct{}, 1)
	l, err := postgres.NewListener(postgres.PoolConnect(db.Pool), postgres.ListenerConfig{Channel: postgres.NotifyEvents, Logger: testlog.New(t),
		AfterListenFunc: func(postgres.ListenParams) { listening <- struct{}{} }})
	require.NoError(t, err)
	listenDone := make(chan error, 1)
	go func() { listenDone <- l.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-listenDone) }()
	select {
	case <-listening:
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the listener never listened")
	}

	polls := make(chan projection.PollParams, 10)
	pub := &recordingPublisher{}
	rl, err := relay.New(backend, pub, relay.Config{MinInterval: time.Hour, MaxInterval: time.Hour, Waker: l, Logger: testlog.New(t),
		AfterPollFunc: func(p projection.PollParams) { polls <- p }})
	require.NoError(t, err)
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-relayDone) }()
	select {
	case p := <-polls:
		require.Zero(t, p.Result.Events)
		require.GreaterOrEqual(t, p.Next, time.Hour, "the next poll is an hour away")
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the relay never polled")
	}

	res, err := store.Append(ctx, "ticket-1", eventstore.Any, eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{}`)})
	require.NoError(t, err)
	// Every poll from here on was woken by a notification: the next is an hour away.
	for {
		select {
		case <-polls:
		case <-time.After(testwait.For(time.Minute)):
			t.Fatal("no notification woke the relay")
		}
		if got, _ := pub.last(); got.Position == res.Last() {
			return
		}
		// The relay was woken before the event was readable (a transaction elsewhere in the
		// cluster held the store's horizon): once it is, notify as an append does.
		require.Eventually(t, func() bool {
			head, err := store.Head(ctx)
			return err == nil && !head.Less(res.Last())
		}, testwait.For(time.Minute), time.Millisecond)
		_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, '')`, postgres.NotifyEvents)
		require.NoError(t, err)
	}
}

// newBackend returns a fresh database with the store and the projection backend migrated in it.
func newBackend(t *testing.T) (*pgtest.DB, *espg.Store, *pjpg.Backend) {
	t.Helper()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, postgres.Migrate(context.Background(), db.Pool, ""))
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	return db, store, backend
}
