package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	eventpg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	nudgepg "github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// newChannel returns a channel on db, closed when t ends.
func newChannel(t testing.TB, db nudgepg.DB, cfg postgres.Config) *postgres.Channel {
	t.Helper()
	ch, err := postgres.New(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	return ch
}

// eventually is how long a test waits for what it expects before it fails: an upper bound for
// a failure on a busy machine, never the expected time.
var eventually = testwait.For(time.Minute)

func TestSuite(t *testing.T) {
	t.Parallel()
	channeltest.Run(t, func(t *testing.T) (channel.Channel, channeltest.RestartFunc) {
		db := pgtest.New(t)
		ch, err := postgres.New(db.Pool, postgres.Config{})
		require.NoError(t, err)
		// A restart closes the channel and every connection of its pool, then opens a new
		// pool and channel on the same database.
		return ch, func(t *testing.T, old channel.Channel) channel.Channel {
			require.NoError(t, old.Close())
			db.Pool.Close()
			re, err := postgres.New(db.NewPool(t, 8), postgres.Config{})
			require.NoError(t, err)
			return re
		}
	})
}

// queued counts the trigger rows waiting for a projection.
func queued(t testing.TB, db nudgepg.DB, projectionName string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM nudge_channel_triggers WHERE projection = $1`, projectionName).Scan(&n))
	return n
}

// TestPublishTx: a trigger published in the append's transaction is delivered when the
// transaction commits and never when it rolls back.
func TestPublishTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := eventpg.New(db.Pool, eventpg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	ch := newChannel(t, db.Pool, postgres.Config{})
	require.NoError(t, ch.Declare(ctx, "tickets"))
	msgs := channeltest.Consume(t, ch, "tickets")
	event := eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{"id":1}`)}

	// Committed: the trigger arrives and names the append's last position.
	var committed eventstore.AppendResult
	require.NoError(t, store.RunInTx(ctx, func(tx pgx.Tx) error {
		res, err := store.AppendTx(ctx, tx, "ticket-1", eventstore.Any, event)
		if err != nil {
			return err
		}
		committed = res
		return ch.PublishTx(ctx, tx, trigger.ForAppend(res, time.Now()))
	}))
	got := channeltest.Next(t, msgs)
	require.Equal(t, committed.Last(), got.Position)
	require.Equal(t, "ticket-1", got.StreamID)
	require.Equal(t, []string{"TicketWasRegistered"}, got.Types)

	// Rolled back: neither the events nor the trigger exist.
	errAbort := errors.New("command failed after the append")
	err = store.RunInTx(ctx, func(tx pgx.Tx) error {
		res, err := store.AppendTx(ctx, tx, "ticket-2", eventstore.Any, event)
		if err != nil {
			return err
		}
		if err := ch.PublishTx(ctx, tx, trigger.ForAppend(res, time.Now())); err != nil {
			return err
		}
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	stream, err := store.ReadStream(ctx, "ticket-2", 0, 10)
	require.NoError(t, err)
	require.Empty(t, stream)
	// Triggers are delivered in publish order: had the rolled-back one been queued, it would
	// arrive before this marker.
	marker := channeltest.Trigger(99)
	require.NoError(t, ch.Publish(ctx, marker))
	require.Equal(t, marker.Position, channeltest.Next(t, msgs).Position)
	require.Eventually(t, func() bool { return queued(t, db.Pool, "tickets") == 0 }, eventually, 10*time.Millisecond)

	require.ErrorContains(t, ch.PublishTx(ctx, nil, marker), "needs a transaction")
}

// TestFanOutReachesOtherProcesses: the fan-out happens in the database, so a projection
// declared only by another process (another Channel, on its own pool) gets every trigger.
func TestFanOutReachesOtherProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	publisherSide := newChannel(t, db.Pool, postgres.Config{})
	workerSide := newChannel(t, db.NewPool(t, 4), postgres.Config{})
	require.NoError(t, publisherSide.Declare(ctx, "alpha"))
	require.NoError(t, workerSide.Declare(ctx, "beta"))
	alpha, beta := channeltest.Consume(t, publisherSide, "alpha"), channeltest.Consume(t, workerSide, "beta")

	require.NoError(t, publisherSide.Publish(ctx, channeltest.Trigger(1)))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, publisherSide.PublishTx(ctx, tx, channeltest.Trigger(2)))
	require.NoError(t, tx.Commit(ctx))

	for _, msgs := range []<-chan *message.Message{alpha, beta} {
		require.Equal(t, int64(1), channeltest.Next(t, msgs).Position.GlobalPosition)
		require.Equal(t, int64(2), channeltest.Next(t, msgs).Position.GlobalPosition)
	}

	// A trigger addressed to beta, published by the side that never declared it.
	only := channeltest.Trigger(3)
	only.Projection = "beta"
	require.NoError(t, publisherSide.Publish(ctx, only))
	require.Equal(t, "beta", channeltest.Next(t, beta).Projection)
	// alpha's acks commit just after its handler acked; no row for trigger 3 may stay.
	require.Eventually(t, func() bool { return queued(t, db.Pool, "alpha") == 0 }, eventually, time.Millisecond)
}

// TestTwoConsumersOfOneProjection: subscriptions take no row locks, so two consumers of one
// projection may both receive a trigger. Triggers are idempotent nudges and the runner
// serialises catch-ups, so this costs a no-op catch-up; acking twice is harmless.
func TestTwoConsumersOfOneProjection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	first := newChannel(t, db.Pool, postgres.Config{PollInterval: 10 * time.Millisecond})
	second := newChannel(t, db.NewPool(t, 4), postgres.Config{PollInterval: 10 * time.Millisecond})
	require.NoError(t, first.Declare(ctx, "alpha"))
	a := channeltest.Consume(t, first, "alpha")
	require.NoError(t, first.Publish(ctx, channeltest.Trigger(7)))

	var held *message.Message
	select {
	case held = <-a:
	case <-time.After(eventually):
		t.Fatal("the first consumer got no trigger")
	}
	// While the first consumer holds the trigger, the second one receives it too.
	b := channeltest.Consume(t, second, "alpha")
	require.Equal(t, int64(7), channeltest.Next(t, b).Position.GlobalPosition)
	held.Ack()
	require.Eventually(t, func() bool { return queued(t, db.Pool, "alpha") == 0 }, eventually, 10*time.Millisecond)
}

// TestAckDeadlineRedeliversTheRestOfTheBatch: a handler that holds a trigger past AckDeadline
// gets it again, and so do the triggers queued behind it in the same batch. watermill-sql
// v4.0.0 alone would delete the whole batch (acked or not) when it acks the first message; the
// channel's offsets adapter deletes only the acked rows.
//
// The test acks the other triggers at once, but on a busy machine even such an ack can miss
// AckDeadline, and then that trigger comes again too: repeats are allowed, loss is not.
func TestAckDeadlineRedeliversTheRestOfTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ch := newChannel(t, db.Pool, postgres.Config{AckDeadline: time.Second, PollInterval: 10 * time.Millisecond})
	require.NoError(t, ch.Declare(ctx, "alpha"))
	for i := range 3 {
		require.NoError(t, ch.Publish(ctx, channeltest.Trigger(int64(i+1))))
	}
	msgs := channeltest.Consume(t, ch, "alpha")
	var held *message.Message // trigger 2, never acked: its context ends at the deadline
	for held == nil {
		msg, tr := channeltest.Receive(t, msgs)
		switch tr.Position.GlobalPosition {
		case 1:
			msg.Ack()
		case 2:
			held = msg
		default:
			t.Fatalf("trigger %d came before trigger 2", tr.Position.GlobalPosition)
		}
	}
	select {
	case <-held.Context().Done():
	case <-time.After(eventually):
		t.Fatal("the held message's context did not end at AckDeadline")
	}
	seen := map[int64]bool{}
	for !seen[2] || !seen[3] {
		n := channeltest.Next(t, msgs).Position.GlobalPosition
		require.True(t, n != 3 || seen[2], "the abandoned trigger comes back, before the rest of its batch")
		seen[n] = true
	}
	require.Eventually(t, func() bool { return queued(t, db.Pool, "alpha") == 0 }, eventually, 10*time.Millisecond,
		"the rest of the batch was delivered and acked, not deleted")
}

// TestRawPublisher: Publisher publishes raw messages to a projection's own topic (a replay),
// refuses unknown topics, and survives a router closing it.
func TestRawPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ch := newChannel(t, db.Pool, postgres.Config{})
	require.NoError(t, ch.Declare(ctx, "alpha", "beta"))
	sub, topic, err := ch.Subscriber("beta")
	require.NoError(t, err)
	require.Equal(t, channel.TriggerTopic+":beta", topic)

	pub := ch.Publisher()
	require.NoError(t, pub.Close(), "a router closing the publisher must not close the channel")
	replay, err := trigger.NewMessage(channeltest.Trigger(5))
	require.NoError(t, err)
	replay.Metadata.Set("reason_poisoned", "boom")
	require.NoError(t, pub.Publish(topic, replay))

	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(t, err)
	select {
	case msg := <-msgs:
		require.Equal(t, replay.UUID, msg.UUID)
		require.Equal(t, "boom", msg.Metadata.Get("reason_poisoned"))
		msg.Ack()
	case <-time.After(eventually):
		t.Fatal("the replayed trigger did not arrive")
	}
	require.Equal(t, 0, queued(t, db.Pool, "alpha"), "a projection's topic reaches that projection only")

	for _, bad := range []string{"nudge.triggers.alpha", "other", channel.TriggerTopic + ":Bad"} {
		require.Error(t, pub.Publish(bad, message.NewMessage("x", []byte("{}"))), bad)
	}
	require.ErrorIs(t, pub.Publish("other", message.NewMessage("x", []byte("{}"))), postgres.ErrUnknownTopic)
}

// TestUndeclare: an undeclared projection's queued triggers go, and it gets no new ones.
func TestUndeclare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ch := newChannel(t, db.Pool, postgres.Config{})
	require.NoError(t, ch.Declare(ctx, "alpha", "beta"))
	require.NoError(t, ch.Publish(ctx, channeltest.Trigger(1)))
	require.Equal(t, 1, queued(t, db.Pool, "beta"))
	require.NoError(t, ch.Undeclare(ctx, "beta"))
	require.Equal(t, 0, queued(t, db.Pool, "beta"))
	require.NoError(t, ch.Publish(ctx, channeltest.Trigger(2)))
	require.Equal(t, 0, queued(t, db.Pool, "beta"))
	require.Equal(t, 2, queued(t, db.Pool, "alpha"))
}

// TestSchema: with Config.Schema every table lives in that schema.
func TestSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ch := newChannel(t, db.Pool, postgres.Config{Schema: "nudge_channel"})
	require.NoError(t, ch.Declare(ctx, "alpha"))
	require.NoError(t, ch.Declare(ctx, "alpha"))
	msgs := channeltest.Consume(t, ch, "alpha")
	require.NoError(t, ch.Publish(ctx, channeltest.Trigger(1)))
	require.Equal(t, int64(1), channeltest.Next(t, msgs).Position.GlobalPosition)
	var tables []string
	rows, err := db.Pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'nudge_channel' ORDER BY 1`)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"nudge_channel_subscriptions", "nudge_channel_triggers", "nudge_schema_migrations"}, tables)
	var inPublic int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&inPublic))
	require.Zero(t, inPublic)
}

// TestConfig: WithDefaults fills every default; bad schema names, durations and batch sizes
// are refused before anything runs, with an error matching ErrInvalidConfig naming the field.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := postgres.Config{}.WithDefaults()
	require.Equal(t, postgres.PollIntervalDefault, cfg.PollInterval)
	require.Equal(t, postgres.AckDeadlineDefault, cfg.AckDeadline)
	require.Equal(t, postgres.ResendIntervalDefault, cfg.ResendInterval)
	require.Equal(t, postgres.RetryIntervalDefault, cfg.RetryInterval)
	require.Equal(t, postgres.BatchSizeDefault, cfg.BatchSize)
	require.NotNil(t, cfg.Logger)
	require.NoError(t, cfg.Validate())

	db := pgtest.New(t)
	for _, schema := range []string{"Nudge", "nudge-channel", "1nudge", `x"; DROP SCHEMA public; --`, "a b"} {
		_, err := postgres.New(db.Pool, postgres.Config{Schema: schema})
		require.ErrorIs(t, err, postgres.ErrInvalidConfig, schema)
		require.ErrorContains(t, err, "lowercase letters, digits and _", schema)
	}
	cases := map[string]postgres.Config{
		"PollInterval":   {PollInterval: -time.Second},
		"AckDeadline":    {AckDeadline: -1},
		"ResendInterval": {ResendInterval: -1},
		"RetryInterval":  {RetryInterval: -1},
		"BatchSize":      {BatchSize: -1},
	}
	for field, bad := range cases {
		_, err := postgres.New(db.Pool, bad)
		require.ErrorIs(t, err, postgres.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field, field)
	}
	_, err := postgres.New(nil, postgres.Config{})
	require.ErrorIs(t, err, postgres.ErrInvalidConfig)
}

// TestClearErrors: the mistakes a user can make say what to do.
func TestClearErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ch := newChannel(t, db.Pool, postgres.Config{})

	err := ch.Publish(ctx, channeltest.Trigger(1))
	require.ErrorIs(t, err, postgres.ErrNotMigrated)
	require.ErrorContains(t, err, "call Declare (or Migrate) once at start-up")
	_, err = ch.Declared(ctx, "ghost")
	require.ErrorIs(t, err, postgres.ErrNotMigrated)

	require.NoError(t, ch.Migrate(ctx))
	require.NoError(t, ch.Publish(ctx, channeltest.Trigger(1)), "no projection declared: nothing to queue")
	ghost := channeltest.Trigger(2)
	ghost.Projection = "ghost"
	err = ch.Publish(ctx, ghost)
	require.ErrorIs(t, err, postgres.ErrNotDeclared)
	require.ErrorContains(t, err, `call Declare(ctx, "ghost") first`)
	declared, err := ch.Declared(ctx, "ghost")
	require.NoError(t, err)
	require.False(t, declared)
	require.NoError(t, ch.Declare(ctx, "ghost"))
	declared, err = ch.Declared(ctx, "ghost")
	require.NoError(t, err)
	require.True(t, declared)

	require.NoError(t, ch.Close())
	require.ErrorIs(t, ch.Publish(ctx, channeltest.Trigger(3)), postgres.ErrClosed)
	_, _, err = ch.Subscriber("alpha")
	require.ErrorIs(t, err, postgres.ErrClosed)
}

// TestWarnsWhenThePoolIsTooSmall: a subscription holds a connection while its handler runs, so
// as many subscriptions as the pool has connections can starve the handlers; the channel says so.
func TestWarnsWhenThePoolIsTooSmall(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ch := newChannel(t, db.NewPool(t, 2), postgres.Config{Logger: log})
	_, _, err := ch.Subscriber("alpha")
	require.NoError(t, err)
	require.Empty(t, logs.String())
	_, _, err = ch.Subscriber("beta")
	require.NoError(t, err)
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "give the channel a larger pool")
	require.Contains(t, logs.String(), "projection=beta")
}
