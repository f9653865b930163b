package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	eventpg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/trigger"
)

// TestHandlerDoesNotHoldTheHorizon shows why subscriptions take no row locks. A handler holds a
// trigger (a projection catch-up retrying with backoff) until the test acks it; meanwhile an
// event is appended.
//
// With the queue schema's SELECT … FOR UPDATE (the control), the subscriber's transaction holds
// a transaction id while the handler runs, and the store — which reads only below the oldest
// running transaction id of the whole cluster — cannot read the event until the trigger is
// acked: every projection waits for the slowest handler. Without the lock the transaction holds
// no id, and the event becomes readable while the handler still holds the trigger.
//
// Not parallel: the locking run holds the cluster-wide horizon while it checks, which would
// also delay the other run (and any other test of this package) beside it.
func TestHandlerDoesNotHoldTheHorizon(t *testing.T) {
	t.Run("with row locks (control)", func(t *testing.T) { checkHorizon(t, true) })
	t.Run("without row locks", func(t *testing.T) { checkHorizon(t, false) })
}

// checkHorizon appends an event while a handler holds a trigger and checks when the event
// becomes readable (Head passes it): with lockRows only after the ack, without while the
// trigger is still held.
func checkHorizon(t *testing.T, lockRows bool) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := eventpg.New(db.Pool, eventpg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))

	// The channel gets a pool of its own, named, so its backend can be found in pg_stat_activity.
	appName := "nudge_horizon_" + randomHex(4)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	chPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(chPool.Close)

	chCfg := Config{PollInterval: 10 * time.Millisecond}
	chCfg.lockRows = lockRows
	ch, err := New(chPool, chCfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	require.NoError(t, ch.Declare(ctx, "slow"))
	sub, topic, err := ch.Subscriber("slow")
	require.NoError(t, err)
	subCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(t, err)
	require.NoError(t, ch.Publish(ctx, trigger.Trigger{At: time.Now(), Reason: trigger.ReasonAppend}))

	// The handler takes the trigger and holds it until the test acks it.
	var held *message.Message
	select {
	case held = <-msgs:
		defer held.Ack() // also when the test fails first
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("no trigger arrived")
	}

	// While it holds the trigger, the subscriber's transaction is idle; with row locks it holds a
	// transaction id, without them it holds none.
	var xid, xmin *string
	require.Eventually(t, func() bool {
		var state string
		err := db.Pool.QueryRow(ctx, `SELECT state, backend_xid::text, backend_xmin::text FROM pg_stat_activity
			WHERE application_name = $1 AND xact_start IS NOT NULL`, appName).Scan(&state, &xid, &xmin)
		return err == nil && state == "idle in transaction"
	}, testwait.For(time.Minute), 5*time.Millisecond)
	t.Logf("lockRows=%v: the subscriber's idle transaction has backend_xid %v, backend_xmin %v", lockRows, deref(xid), deref(xmin))
	if lockRows {
		require.NotNil(t, xid, "SELECT … FOR UPDATE gives the subscriber's transaction an id")
	} else {
		require.Nil(t, xid, "the subscriber's transaction must hold no transaction id while the handler runs")
		// At READ COMMITTED it holds no snapshot between statements either, so it does not
		// hold back VACUUM.
		require.Nil(t, xmin, "the subscriber's transaction must hold no snapshot while the handler runs")
	}

	res, err := store.Append(ctx, "horizon", eventstore.Any, eventstore.EventData{Type: "Measured", Payload: []byte(`{}`)})
	require.NoError(t, err)
	if lockRows {
		// The subscriber's id is older than the append's: the event waits for the ack.
		require.False(t, readable(t, store, res.Last()), "with row locks the handler's transaction holds the horizon until the ack")
		held.Ack()
		waitReadable(t, store, db.Pool, res.Last(), "after the ack")
		return
	}
	// Other tests' transactions on the server may hold the horizon for a while; this handler
	// holds its trigger until the test ends, so the event must pass it.
	waitReadable(t, store, db.Pool, res.Last(), "while the handler holds its trigger, without row locks")
}

// readable reports whether the store's Head has passed p.
func readable(t *testing.T, store *eventpg.Store, p eventstore.Position) bool {
	t.Helper()
	head, err := store.Head(context.Background())
	require.NoError(t, err)
	return !head.Less(p)
}

// waitReadable waits until the store's Head passes p, or fails naming the transactions that
// hold the horizon.
func waitReadable(t *testing.T, store *eventpg.Store, db *pgxpool.Pool, p eventstore.Position, when string) {
	t.Helper()
	deadline := time.Now().Add(testwait.For(2 * time.Minute))
	for !readable(t, store, p) {
		if time.Now().After(deadline) {
			t.Fatalf("the appended event was not readable %s; transactions holding ids in the cluster:\n%s",
				when, horizonHolders(t, db))
		}
		time.Sleep(2 * time.Millisecond) // polling Head
	}
}

// horizonHolders lists the cluster's transactions that hold an id, for failure messages: a
// test elsewhere that keeps a writing transaction open delays every horizon read.
func horizonHolders(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT coalesce(datname, ''), application_name, backend_xid::text, (now() - xact_start)::text
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start`)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var db, app, xid, age string
		err := row.Scan(&db, &app, &xid, &age)
		return fmt.Sprintf("  %s %s xid %s open %s", db, app, xid, age), err
	})
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}
