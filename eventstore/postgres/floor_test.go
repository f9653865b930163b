package postgres

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/gdbstop"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestHorizonFloor forces, with gdb on the backends of a private cluster, the interleaving in
// which the horizon moves back below an event a reader has already read:
//
//  1. X, a transaction of database other, writes a table there and stays open (exempt: it
//     holds a lock of its database and none of the store's). E appends and commits (E > X).
//  2. The reader reads E (X is passed). A second store, the control, has read nothing.
//  3. Both start a read from the start; each stops at its lock-table scan, X in its snapshot.
//  4. X commits and stops in its commit window: its locks are listed under "<backend>/0",
//     where nothing tells its database, so a scan counts X as one that may append.
//  5. Both scan and finish.
//
// The control's horizon is X: it reads nothing, though E was readable a moment before. The
// reader's floor (the newest transaction it read through the horizon) keeps E readable.
func TestHorizonFloor(t *testing.T) {
	ctx := testwait.Context(t, 5*time.Minute)
	_, connect := clusterWithOtherDatabase(ctx, t, pgcluster.Options{})
	admin := connect("postgres")
	s, err := New(admin, Config{Schema: "floor"})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	// 1. X writes in database other and stays open; E appends and commits.
	connX := connect("other")
	txX, err := connX.Begin(ctx)
	require.NoError(t, err)
	_, err = txX.Exec(ctx, `INSERT INTO report VALUES (1)`)
	require.NoError(t, err)
	_, err = s.Append(ctx, "e", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
	require.NoError(t, err)

	// 2. The reader reads E past X.
	connR, connC := connect("postgres"), connect("postgres")
	reader, err := New(connR, Config{Schema: "floor"})
	require.NoError(t, err)
	control, err := New(connC, Config{Schema: "floor"})
	require.NoError(t, err)
	first, err := reader.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"e"}, streams(first), "X, of another database, holds no reader back")

	// 3. Both readers stop at their lock-table scans, X in their snapshots.
	type readResult struct {
		events []eventstore.Event
		err    error
	}
	start := func(conn *pgx.Conn, s *Store) (*gdbstop.Process, chan struct{}, *readResult) {
		g := gdbstop.ForTest(t, int(conn.PgConn().PID()))
		require.NoError(t, g.Break(ctx, "GetLockStatusData"))
		require.NoError(t, g.Continue(ctx))
		done, res := make(chan struct{}), &readResult{}
		go func() {
			defer close(done)
			res.events, res.err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		}()
		_, err := g.WaitBreak(ctx)
		require.NoError(t, err)
		return g, done, res
	}
	gR, doneR, resR := start(connR, reader)
	gC, doneC, resC := start(connC, control)

	// 4. X commits and stops in its commit window.
	gX := gdbstop.ForTest(t, int(connX.PgConn().PID()))
	require.NoError(t, gX.Break(ctx, "ProcReleaseLocks"))
	require.NoError(t, gX.Continue(ctx))
	commitX := make(chan error, 1)
	go func() { commitX <- txX.Commit(ctx) }()
	_, err = gX.WaitBreak(ctx)
	require.NoError(t, err)

	// 5. Both scan (again, if they scan more than once) and finish; then X finishes.
	finish := func(g *gdbstop.Process, done chan struct{}) {
		for {
			require.NoError(t, g.Continue(ctx))
			_, again, err := g.WaitBreakOr(ctx, done)
			require.NoError(t, err)
			if !again {
				return
			}
		}
	}
	finish(gC, doneC)
	finish(gR, doneR)
	require.NoError(t, resC.err)
	require.NoError(t, resR.err)
	require.NoError(t, gX.Continue(ctx))
	require.NoError(t, <-commitX)
	gR.Detach()
	gC.Detach()
	gX.Detach()

	require.Empty(t, streams(resC.events), "the interleaving was not reproduced: the control's horizon should have counted X and read nothing")
	require.Equal(t, []string{"e"}, streams(resR.events), "the reader must read again what it read before")
}
