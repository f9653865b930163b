package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/postgres"
)

// runListener runs l until t ends.
func runListener(t *testing.T, l *postgres.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
}

// receive waits for a value from ch, or fails t with what.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testwait.For(time.Minute)):
		t.Fatalf("never happened: %s", what)
		panic("unreachable")
	}
}

// drain empties a wake-up channel.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func newStore(t *testing.T, db *pgtest.DB) *espg.Store {
	t.Helper()
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	return store
}

// TestListenerWakesOnAppend: the commit of appends made in a caller's transaction wakes a
// subscriber, and so does a plain Append after it.
func TestListenerWakesOnAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store := newStore(t, db)
	pids := make(chan uint32, 1)
	l, err := postgres.NewListener(postgres.PoolConnect(db.Pool), postgres.ListenerConfig{
		Channel: postgres.NotifyEvents, Logger: testlog.New(t),
		AfterListenFunc: func(p postgres.ListenParams) { pids <- p.PID },
	})
	require.NoError(t, err)
	woken, stop := l.Subscribe()
	defer stop()
	runListener(t, l)
	receive(t, pids, "LISTEN")
	require.True(t, l.Listening())
	receive(t, woken, "the wake-up after LISTEN")

	event := eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{}`)}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = store.AppendTx(ctx, tx, "t-2", eventstore.Any, event)
	require.NoError(t, err)
	_, err = store.AppendTx(ctx, tx, "t-3", eventstore.Any, event)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	receive(t, woken, "the wake-up after the commit")
	_, err = store.Append(ctx, "t-4", eventstore.Any, event)
	require.NoError(t, err)
	receive(t, woken, "the wake-up after the second commit")
}

// TestListenerReconnects: when its backend is terminated, the listener wakes its subscribers
// (they drop to their short poll), reports not listening, reconnects on a new backend, wakes
// them again (notifications sent meanwhile were lost) and delivers notifications again.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store := newStore(t, db)
	pids := make(chan uint32, 4)
	l, err := postgres.NewListener(postgres.PoolConnect(db.Pool), postgres.ListenerConfig{
		Channel: postgres.NotifyEvents, Logger: testlog.New(t), ReconnectMinInterval: time.Millisecond,
		AfterListenFunc: func(p postgres.ListenParams) { pids <- p.PID },
	})
	require.NoError(t, err)
	woken, stop := l.Subscribe()
	defer stop()
	runListener(t, l)

	first := receive(t, pids, "the first LISTEN")
	receive(t, woken, "the wake-up after LISTEN")
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first)
	require.NoError(t, err)
	receive(t, woken, "the wake-up after the loss")
	second := receive(t, pids, "the second LISTEN")
	require.NotEqual(t, first, second)
	require.Eventually(t, l.Listening, testwait.For(time.Minute), time.Millisecond)
	drain(woken)
	_, err = store.Append(ctx, "t-1", eventstore.Any, eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{}`)})
	require.NoError(t, err)
	receive(t, woken, "the wake-up after an append, on the new connection")
}

func TestListenerConfig(t *testing.T) {
	t.Parallel()
	_, err := postgres.NewListener(nil, postgres.ListenerConfig{Channel: postgres.NotifyEvents})
	require.ErrorIs(t, err, postgres.ErrInvalidListenerConfig)
	connect := func(context.Context) (*pgx.Conn, error) { return nil, errors.New("unused") }
	_, err = postgres.NewListener(connect, postgres.ListenerConfig{})
	require.ErrorIs(t, err, postgres.ErrInvalidListenerConfig)
	_, err = postgres.NewListener(connect, postgres.ListenerConfig{Channel: "x", ReconnectMinInterval: time.Second, ReconnectMaxInterval: time.Millisecond})
	require.ErrorIs(t, err, postgres.ErrInvalidListenerConfig)
	l, err := postgres.NewListener(connect, postgres.ListenerConfig{Channel: "x"})
	require.NoError(t, err)
	require.False(t, l.Listening())
}
