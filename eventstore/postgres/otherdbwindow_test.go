package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/gdbstop"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// twoScans is a wrong narrowing, the control of TestHorizonOtherDatabaseSlotReuse: it looks
// for the other database's lock in a second scan of the lock table, after the one of the ids
// (an init plan, evaluated at its first use), and trusts finished virtual transactions
// ("<backend>/0").
var twoScans = horizonWith(`SELECT t.transactionid FROM pg_locks t
	WHERE t.locktype = 'transactionid' AND t.mode = 'ExclusiveLock' AND t.granted
		AND t.virtualtransaction = ANY (ARRAY(SELECT o.virtualtransaction FROM pg_locks o WHERE o.granted
			AND o.database <> 0 AND o.database <> (SELECT oid FROM pg_database WHERE datname = current_database())))`)

// TestHorizonOtherDatabaseSlotReuse forces, with gdb on the backends of a private cluster, the
// interleaving in which a backend of the store's database ends and a backend of another
// database takes its place (its backend id, the first part of its virtual transaction ids)
// while a reader whose snapshot lists the first backend's transaction as running reads the
// lock table:
//
//  1. C (on a backend of this database, id k) appends to stream "n" and stays open; M appends
//     to "m" and commits (M > C).
//  2. The reader starts a read; it stops at its first lock-table scan, C in its snapshot.
//  3. C commits and stops in its commit window: its id lock is listed under "k/0".
//  4. The reader scans the lock table and, if it scans it again, stops there.
//  5. C's backend ends; a backend of database other takes backend id k, writes a table there
//     and stops in its commit window: its lock of database other is listed under "k/0" too.
//  6. The reader scans again and finishes.
//
// With the lock of the other database looked for in a second scan (the control), the reader
// ties C's id to that lock, takes C for a transaction of the other database, reads M's event
// past C, and C's event — committed, but invisible to the reader's snapshot — is never read.
// The store's horizon scans once, and within one scan a snapshot's transaction still holding
// its id lock has held its backend id since before the snapshot: the reader waits for C.
func TestHorizonOtherDatabaseSlotReuse(t *testing.T) {
	ctx := testwait.Context(t, 5*time.Minute)
	c, connect := clusterWithOtherDatabase(ctx, t, pgcluster.Options{})
	admin := connect("postgres")

	t.Run("a second lock-table scan skips (control)", func(t *testing.T) {
		res := slotReuse(ctx, t, c, admin, "control", true)
		require.Equal(t, []string{"m"}, res.read, "the interleaving was not reproduced: the control should have passed C and read M")
		require.Equal(t, []string{"m"}, res.all, "C's event should be skipped with the control")
	})
	t.Run("one lock-table scan waits", func(t *testing.T) {
		res := slotReuse(ctx, t, c, admin, "fixed", false)
		require.Equal(t, 1, res.scans, "the horizon must scan the lock table once per statement")
		require.Empty(t, res.read, "the reader must wait for C, which its snapshot lists as running")
		require.Equal(t, []string{"n", "m"}, res.all, "every event, once, in commit order")
	})
}

func slotReuse(ctx context.Context, t *testing.T, c *pgcluster.Cluster, admin *pgx.Conn, schema string, control bool) windowResult {
	connect := func(db string) *pgx.Conn {
		conn, err := pgx.Connect(ctx, c.URL(db, ""))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	backendID := func(conn *pgx.Conn) string {
		var vxid string
		require.NoError(t, conn.QueryRow(ctx, `SELECT virtualtransaction FROM pg_locks WHERE pid = pg_backend_pid() LIMIT 1`).Scan(&vxid))
		return strings.Split(vxid, "/")[0]
	}
	s, err := New(admin, Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	connR := connect("postgres")
	connC, err := pgx.Connect(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	reader, err := New(connR, Config{Schema: schema})
	require.NoError(t, err)
	read := func(after eventstore.Position) ([]eventstore.Event, error) {
		if !control {
			return reader.Read(ctx, after, eventstore.ReadOptions{})
		}
		q := strings.NewReplacer("{events}", schema+".nudge_events").Replace(
			`SELECT ` + eventColumns + ` FROM {events} WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint)
				AND transaction_id < ` + twoScans + ` ORDER BY transaction_id, global_position LIMIT 100`)
		rows, err := connR.Query(ctx, q, after.TransactionID, after.GlobalPosition)
		if err != nil {
			return nil, err
		}
		return collectEvents(rows, 2)
	}

	// 1. C appends and stays open; M appends and commits.
	k := backendID(connC)
	pidC := connC.PgConn().PID()
	txC, err := connC.Begin(ctx)
	require.NoError(t, err)
	_, err = s.AppendTx(ctx, txC, "n", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, err = s.Append(ctx, "m", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
	require.NoError(t, err)

	// 2. The reader stops at its first lock-table scan.
	gR := gdbstop.ForTest(t, int(connR.PgConn().PID()))
	require.NoError(t, gR.Break(ctx, "GetLockStatusData"))
	require.NoError(t, gR.Continue(ctx))
	var (
		firstRead []eventstore.Event
		readErr   error
		readDone  = make(chan struct{})
	)
	go func() { defer close(readDone); firstRead, readErr = read(eventstore.Position{}) }()
	_, err = gR.WaitBreak(ctx)
	require.NoError(t, err)
	scans := 1

	// 3. C commits and stops in its commit window.
	gC := gdbstop.ForTest(t, int(pidC))
	require.NoError(t, gC.Break(ctx, "ProcReleaseLocks"))
	require.NoError(t, gC.Continue(ctx))
	commitC := make(chan error, 1)
	go func() { commitC <- txC.Commit(ctx) }()
	_, err = gC.WaitBreak(ctx)
	require.NoError(t, err)

	// 4. The reader scans; a second scan stops it again.
	require.NoError(t, gR.Continue(ctx))
	_, again, err := gR.WaitBreakOr(ctx, readDone)
	require.NoError(t, err)

	// 5. C's backend ends; a backend of database other takes its backend id, writes there and
	// stops in its commit window.
	require.NoError(t, gC.Continue(ctx))
	require.NoError(t, <-commitC)
	gC.Detach()
	require.NoError(t, connC.Close(ctx))
	require.Eventually(t, func() bool {
		var gone bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pidC).Scan(&gone))
		return gone
	}, testwait.For(time.Minute), 10*time.Millisecond, "C's backend ends")
	var connB *pgx.Conn
	for range 10 { // a lower backend id freed meanwhile (an autovacuum worker) is taken first
		conn := connect("other")
		if backendID(conn) == k {
			connB = conn
			break
		}
	}
	require.NotNil(t, connB, "no backend of database other took backend id %s", k)
	gB := gdbstop.ForTest(t, int(connB.PgConn().PID()))
	require.NoError(t, gB.Break(ctx, "ProcReleaseLocks"))
	require.NoError(t, gB.Continue(ctx))
	txB, err := connB.Begin(ctx)
	require.NoError(t, err)
	_, err = txB.Exec(ctx, `INSERT INTO report VALUES (1)`)
	require.NoError(t, err)
	commitB := make(chan error, 1)
	go func() { commitB <- txB.Commit(ctx) }()
	_, err = gB.WaitBreak(ctx)
	require.NoError(t, err)

	// 6. The reader scans again and finishes; then B finishes.
	if again {
		scans++
		require.NoError(t, gR.Continue(ctx))
		_, more, err := gR.WaitBreakOr(ctx, readDone)
		require.NoError(t, err)
		require.False(t, more, "at most two lock-table scans")
	}
	<-readDone
	require.NoError(t, readErr)
	require.NoError(t, gB.Continue(ctx))
	require.NoError(t, <-commitB)
	gR.Detach()
	gB.Detach()

	// Read on from where the interleaved read stopped, as a projection would, until both
	// events' transactions are below the horizon (nothing else runs on this cluster).
	res := windowResult{scans: scans, read: streams(firstRead)}
	got := firstRead
	after := eventstore.Position{}
	if len(got) > 0 {
		after = got[len(got)-1].Position
	}
	head, err := s.Head(ctx)
	require.NoError(t, err)
	for after.Less(head) {
		more, err := read(after)
		require.NoError(t, err)
		if len(more) == 0 {
			break
		}
		got = append(got, more...)
		after = more[len(more)-1].Position
	}
	res.all = streams(got)
	return res
}
