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
	"github.com/nudgeworks/nudge/internal/pghorizon"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// legacyReadable is the horizon as it was before it read the lock table once: two references
// to pg_locks, that is two calls of pg_lock_status(), two snapshots of the lock table tied
// together by virtualtransaction. It is kept here as the control of TestHorizonCommitWindow:
// the same interleaving must skip an event with it.
const legacyReadable = `(SELECT least(coalesce((SELECT min(x) FROM pg_snapshot_xip(s) x
			WHERE x::xid <> ALL (ARRAY(SELECT t.transactionid FROM pg_locks t JOIN pg_locks a
				ON a.virtualtransaction = t.virtualtransaction
				WHERE t.locktype = 'transactionid' AND t.mode = 'ExclusiveLock' AND t.granted
					AND a.locktype = 'advisory' AND a.granted AND a.mode = 'ShareLock'
					AND a.database = (SELECT oid FROM pg_database WHERE datname = current_database())
					AND a.classid = ` + pghorizon.ExemptClass + `::oid AND a.objid = {key}::oid AND a.objsubid = 2))),
		pg_snapshot_xmax(s)), pg_current_xact_id_if_assigned())
	FROM pg_current_snapshot() s)`

// TestHorizonCommitWindow forces, with gdb on the backends of a private cluster, the
// interleaving in which backend B commits a transaction N that appended events and then, on the
// same connection, commits an exempt projection batch E, while a reader whose snapshot still
// lists N as running reads the lock table:
//
//  1. N (on B) appends to stream "n" and stays open; M appends to "m" and commits (M > N).
//  2. The reader starts a read; it stops at its first lock-table scan (GetLockStatusData), its
//     statement snapshot taken, N in it as running.
//  3. B commits N and stops in the commit window (ProcReleaseLocks: after N left the proc
//     array, before its locks go): N's xid lock is listed under virtual transaction "B/0".
//  4. The reader scans the lock table and, if it scans it again, stops there.
//  5. B finishes N, runs E (exempt, writes a row) and stops in E's commit window: E's
//     advisory lock is listed under "B/0" too.
//  6. The reader scans again and finishes.
//
// With two scans (the control) the join pairs N's xid lock with E's advisory lock, takes N for
// exempt, reads M's event past N, and N's event — committed, but invisible to the reader's
// snapshot — is never read. With one scan the reader cannot pair locks of two transactions and
// waits for N.
func TestHorizonCommitWindow(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, 5*time.Minute)

	t.Run("two lock-table scans skip (control)", func(t *testing.T) {
		res := commitWindow(ctx, t, c, "control", true)
		require.Equal(t, 2, res.scans, "the legacy horizon scans the lock table twice")
		require.Equal(t, []string{"m"}, res.read, "the interleaving was not reproduced: the legacy horizon should have passed N and read M")
		require.Equal(t, []string{"m"}, res.all, "N's event should be skipped with the legacy horizon")
	})
	t.Run("one lock-table scan waits", func(t *testing.T) {
		res := commitWindow(ctx, t, c, "fixed", false)
		require.Equal(t, 1, res.scans, "the horizon must scan the lock table once per statement")
		require.Empty(t, res.read, "the reader must wait for N, which its snapshot lists as running")
		require.Equal(t, []string{"n", "m"}, res.all, "every event, once, in commit order")
	})
}

type windowResult struct {
	scans int      // lock-table scans of the reader's statement
	read  []string // streams of the events the interleaved read returned
	all   []string // streams of every event the reader got, then and later
}

func commitWindow(ctx context.Context, t *testing.T, c *pgcluster.Cluster, schema string, legacy bool) windowResult {
	url := c.URL("postgres", "")
	connect := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	admin, connB, connR := connect(), connect(), connect()
	s, err := New(admin, Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	_, err = admin.Exec(ctx, `CREATE TABLE `+schema+`.read_model (n int)`)
	require.NoError(t, err)

	reader, err := New(connR, Config{Schema: schema})
	require.NoError(t, err)
	read := func(after eventstore.Position) ([]eventstore.Event, error) {
		if !legacy {
			return reader.Read(ctx, after, eventstore.ReadOptions{})
		}
		q := strings.NewReplacer("{events}", schema+".nudge_events", "{key}", s.sql.key).Replace(
			`SELECT ` + eventColumns + ` FROM {events} WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint)
				AND transaction_id < ` + legacyReadable + ` ORDER BY transaction_id, global_position LIMIT 100`)
		rows, err := connR.Query(ctx, q, after.TransactionID, after.GlobalPosition)
		if err != nil {
			return nil, err
		}
		return collectEvents(rows, 2)
	}

	// 1. N appends and stays open; M appends and commits.
	txN, err := connB.Begin(ctx)
	require.NoError(t, err)
	_, err = s.AppendTx(ctx, txN, "n", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
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

	// 3. B commits N and stops in its commit window.
	gB := gdbstop.ForTest(t, int(connB.PgConn().PID()))
	require.NoError(t, gB.Break(ctx, "ProcReleaseLocks"))
	require.NoError(t, gB.Continue(ctx))
	commitN := make(chan error, 1)
	go func() { commitN <- txN.Commit(ctx) }()
	_, err = gB.WaitBreak(ctx)
	require.NoError(t, err)

	// 4. The reader scans; a second scan stops it again.
	require.NoError(t, gR.Continue(ctx))
	_, again, err := gR.WaitBreakOr(ctx, readDone)
	require.NoError(t, err)

	// 5. B finishes N and runs the exempt batch E, stopping in E's commit window.
	require.NoError(t, gB.Continue(ctx))
	require.NoError(t, <-commitN)
	txE, err := connB.BeginTx(ctx, s.ExemptTxOptions(pgx.TxOptions{}))
	require.NoError(t, err)
	_, err = txE.Exec(ctx, `INSERT INTO `+schema+`.read_model VALUES (1)`)
	require.NoError(t, err)
	commitE := make(chan error, 1)
	go func() { commitE <- txE.Commit(ctx) }()
	_, err = gB.WaitBreak(ctx)
	require.NoError(t, err)

	// 6. The reader scans again and finishes; then B finishes E.
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
	require.NoError(t, <-commitE)
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

func streams(events []eventstore.Event) []string {
	out := []string{}
	for _, e := range events {
		out = append(out, e.StreamID)
	}
	return out
}
