package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	nudgepg "github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// wakeHarness is a channel with one subscription whose waits and listening connections the
// test observes.
type wakeHarness struct {
	ch *Channel
	// waiting receives whether the listener listened, each time the subscription starts to
	// wait after a poll that found nothing.
	waiting chan bool
	// pids receives the backend of every listening connection.
	pids chan uint32
	msgs <-chan *message.Message
}

func newWakeHarness(t *testing.T, db *pgtest.DB, cfg Config) *wakeHarness {
	t.Helper()
	h := &wakeHarness{waiting: make(chan bool, 100), pids: make(chan uint32, 10)}
	cfg.waitingFunc = func(listening bool) {
		select {
		case h.waiting <- listening:
		default:
		}
	}
	cfg.ListenerConfig.AfterListenFunc = func(p nudgepg.ListenParams) { h.pids <- p.PID }
	ch, err := New(db.Pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	h.ch = ch
	require.NoError(t, ch.Declare(context.Background(), "tickets"))
	sub, topic, err := ch.Subscriber("tickets")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.msgs, err = sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	return h
}

// waitIdle drains what was observed so far and returns once the subscription waits with the
// listener in the given state: a trigger published after it can only arrive through a
// wake-up (or the fallback poll).
func (h *wakeHarness) waitIdle(t *testing.T, listening bool) {
	t.Helper()
	deadline := time.After(testwait.For(time.Minute))
	for {
		select {
		case l := <-h.waiting:
			if l == listening && len(h.waiting) == 0 {
				return
			}
		case <-deadline:
			t.Fatalf("the subscription never waited with listening=%v", listening)
		}
	}
}

func (h *wakeHarness) publishAndReceive(t *testing.T, position int64) {
	t.Helper()
	require.NoError(t, h.ch.Publish(context.Background(), trigger.Trigger{Position: eventstore.Position{TransactionID: 1, GlobalPosition: position}, Reason: trigger.ReasonAppend}))
	select {
	case msg := <-h.msgs:
		got, err := trigger.Decode(msg.Payload)
		require.NoError(t, err)
		require.Equal(t, position, got.Position.GlobalPosition)
		msg.Ack()
	case <-time.After(testwait.For(time.Minute)):
		t.Fatalf("trigger %d never arrived", position)
	}
}

// TestNotificationWakesTheSubscription: with the fallback poll an hour away, a trigger queued
// while the subscription waits arrives, so the notification of its insert woke it.
func TestNotificationWakesTheSubscription(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newWakeHarness(t, db, Config{PollInterval: time.Hour})
	<-h.pids
	h.waitIdle(t, true)
	h.publishAndReceive(t, 1)
}

// TestListenerReconnectsAndPollsMeanwhile: when the listening backend is terminated the
// subscription falls back to PollInterval (a trigger published while nobody listens still
// arrives), and once the listener has reconnected, notifications wake it again.
func TestListenerReconnectsAndPollsMeanwhile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// While not listening, the subscription polls every 20 ms; while listening, once an hour.
	h := newWakeHarness(t, db, Config{PollInterval: 20 * time.Millisecond, ListeningPollInterval: time.Hour,
		ListenerConfig: nudgepg.ListenerConfig{ReconnectMinInterval: time.Hour, ReconnectMaxInterval: time.Hour}})
	first := <-h.pids
	h.waitIdle(t, true)

	// The first loss reconnects only after an hour: meanwhile the poll delivers.
	_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first)
	require.NoError(t, err)
	h.waitIdle(t, false)
	require.False(t, h.ch.Listening())
	h.publishAndReceive(t, 1)
}

// TestListenerComesBack: after the listening backend is terminated the listener reconnects
// (a new backend) and notifications wake the subscription again.
func TestListenerComesBack(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	h := newWakeHarness(t, db, Config{PollInterval: time.Hour, ListenerConfig: nudgepg.ListenerConfig{ReconnectMinInterval: time.Millisecond}})
	first := <-h.pids
	h.waitIdle(t, true)
	_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first)
	require.NoError(t, err)
	var second uint32
	select {
	case second = <-h.pids:
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the listener never reconnected")
	}
	require.NotEqual(t, first, second, "a new backend listens")
	h.waitIdle(t, true)
	h.publishAndReceive(t, 2)
}

// TestSweepDeliversATriggerNobodyAnnounced: a trigger queued with the queue table's triggers
// disabled sends no notification, yet it arrives while the listener listens and the
// subscription itself no longer polls: the channel's one fallback poll (the sweep) finds it
// and wakes the subscription.
func TestSweepDeliversATriggerNobodyAnnounced(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	swept := make(chan []string, 1000)
	h := newWakeHarness(t, db, Config{PollInterval: time.Hour, ListeningPollInterval: 50 * time.Millisecond,
		sweptFunc: func(woken []string) {
			select {
			case swept <- woken:
			default:
			}
		}})
	<-h.pids
	h.waitIdle(t, true)

	// A connection of the test's own sees which notifications are sent, in commit order.
	probe, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer probe.Release()
	_, err = probe.Exec(ctx, `LISTEN `+nudgepg.NotifyTriggers)
	require.NoError(t, err)

	// session_replication_role = replica turns the queue's notifying trigger off.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	require.NoError(t, h.ch.PublishTx(ctx, tx, trigger.Trigger{Position: eventstore.Position{TransactionID: 1, GlobalPosition: 7}, Reason: trigger.ReasonAppend}))
	require.NoError(t, tx.Commit(ctx))

	select {
	case msg := <-h.msgs:
		got, err := trigger.Decode(msg.Payload)
		require.NoError(t, err)
		require.Equal(t, int64(7), got.Position.GlobalPosition)
		msg.Ack()
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the trigger queued without a notification never arrived")
	}
	// The sweep found it.
	found := false
	for !found {
		select {
		case woken := <-swept:
			found = slices.Contains(woken, "tickets")
		default:
			t.Fatal("no sweep reported the trigger of tickets, yet it arrived")
		}
	}
	// And no notification announced it: the first one the probe gets is sent after it.
	_, err = db.Pool.Exec(ctx, `SELECT pg_notify($1, 'after')`, nudgepg.NotifyTriggers)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, testwait.For(time.Minute))
	defer cancel()
	n, err := probe.Conn().WaitForNotification(waitCtx)
	require.NoError(t, err)
	require.Equal(t, "after", n.Payload, "the trigger queued with triggers disabled sent no notification")
}
