package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	eventpg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/trigger"
)

// horizonHold is how long the measured handler holds its trigger.
const horizonHold = 3 * time.Second

// TestHandlerDoesNotHoldTheHorizon measures why subscriptions take no row locks. A handler
// holds a trigger for horizonHold (a projection catch-up retrying with backoff); meanwhile an
// event is appended and the test measures how long until the event store's Head passes it.
//
// With the queue schema's SELECT … FOR UPDATE, the subscriber's transaction holds a
// transaction id while the handler runs, and the store — which reads only below the oldest
// running transaction id of the whole cluster — cannot read the event until the trigger is
// acked: every projection waits for the slowest handler. Without the lock the transaction
// holds no id and the event is readable at once.
//
// Not parallel: the locking run holds the cluster-wide horizon for horizonHold, which would
// also delay the unlocking run (and any other test of this package) beside it.
func TestHandlerDoesNotHoldTheHorizon(t *testing.T) {
	locked := measureHorizon(t, true)
	unlocked := measureHorizon(t, false)
	t.Logf("handler holding a trigger for %v: appended event readable after %v with FOR UPDATE, after %v without",
		horizonHold, locked.Round(time.Millisecond), unlocked.Round(time.Millisecond))
	require.Greater(t, locked, horizonHold-time.Second, "with row locks the handler's transaction holds the horizon until the ack")
	require.Less(t, unlocked, time.Second, "without row locks a held trigger must not hold back the event store")
}

// measureHorizon returns how long an event appended while a handler holds a trigger takes to
// become readable (Head passes it).
func measureHorizon(t *testing.T, lockRows bool) time.Duration {
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
	require.NoError(t, ch.Publish(ctx, trigger.Trigger{At: time.Now(), Reason: trigger.ReasonTick}))

	// The handler takes the trigger and holds it for horizonHold.
	var received time.Time
	select {
	case msg := <-msgs:
		received = time.Now()
		time.AfterFunc(horizonHold, func() { msg.Ack() })
	case <-time.After(15 * time.Second):
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
	}, 5*time.Second, 5*time.Millisecond)
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
	appended := time.Now()
	deadline := appended.Add(horizonHold + 10*time.Second)
	for {
		head, err := store.Head(ctx)
		require.NoError(t, err)
		if !head.Less(res.Last()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the appended event was not readable after %v; transactions holding ids in the cluster:\n%s",
				time.Since(appended), horizonHolders(t, db.Pool))
		}
		time.Sleep(2 * time.Millisecond) // polling Head is the measurement
	}
	readable := time.Since(appended)
	if !lockRows && time.Since(received) >= horizonHold {
		t.Fatalf("the event became readable only after the handler released its trigger (%v); transactions holding ids:\n%s",
			readable, horizonHolders(t, db.Pool))
	}
	return readable
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
