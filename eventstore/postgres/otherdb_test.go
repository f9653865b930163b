package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/pghorizon"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// horizonWith is the horizon with exempt as the list of exempt transaction ids, for the
// controls of TestHorizonOtherDatabase.
func horizonWith(exempt string) string {
	return `(SELECT least(coalesce((SELECT min(x) FROM pg_snapshot_xip(s) x
			WHERE x::xid <> ALL (ARRAY(` + exempt + `))),
		pg_snapshot_xmax(s)), pg_current_xact_id_if_assigned())
	FROM pg_current_snapshot() s)`
}

// The controls of TestHorizonOtherDatabase: the horizon before it left other databases out,
// and two wrong ways of leaving them out.
var (
	// clusterWide counts every transaction of the cluster but the exempt batches.
	clusterWide = horizonWith(`SELECT unnest(array_agg(transactionid) FILTER (WHERE locktype = 'transactionid'))
	FROM pg_locks
	WHERE granted AND virtualtransaction NOT LIKE '%/0'
		AND ((locktype = 'transactionid' AND mode = 'ExclusiveLock')
			OR (locktype = 'advisory' AND mode = 'ShareLock' AND classid = ` + pghorizon.ExemptClass + `::oid AND objid = {key} AND objsubid = 2
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())))
	GROUP BY virtualtransaction
	HAVING bool_or(locktype = 'advisory')`)
	// byPID ties locks by pg_locks.pid, which is NULL for every prepared transaction, and
	// leaves out a transaction with a lock in another database.
	byPID = horizonWith(`SELECT unnest(array_agg(transactionid) FILTER (WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock'))
	FROM pg_locks, (SELECT oid AS here FROM pg_database WHERE datname = current_database()) d
	WHERE granted AND virtualtransaction NOT LIKE '%/0'
	GROUP BY pid, here
	HAVING bool_or(database <> 0 AND database <> here)`)
	// noLockHere leaves out a transaction with no lock in this database, whether or not it
	// shows one of another.
	noLockHere = horizonWith(`SELECT unnest(array_agg(transactionid) FILTER (WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock'))
	FROM pg_locks, (SELECT oid AS here FROM pg_database WHERE datname = current_database()) d
	WHERE granted AND virtualtransaction NOT LIKE '%/0'
	GROUP BY virtualtransaction, here
	HAVING NOT coalesce(bool_or(database = here), false)`)
)

// TestHorizonOtherDatabase: a transaction in another database of the cluster can never write
// the store's events, so it holds no reader back, whether it runs or is prepared; a transaction
// of the store's database that holds no lock yet (it only took an id) still does. Each case
// reads with the store's horizon and with a control that must read otherwise: the horizon
// before (cluster-wide: readers wait for the other database), and two wrong narrowings that
// skip an event.
func TestHorizonOtherDatabase(t *testing.T) {
	ctx := testwait.Context(t, 5*time.Minute)
	_, connect := clusterWithOtherDatabase(ctx, t, pgcluster.Options{MaxPreparedTransactions: 4})
	admin, other := connect("postgres"), connect("other")

	// newStore migrates a store in schema and returns it with a read of its events, from the
	// start, below horizon ("" for the store's own).
	newStore := func(schema string) (*Store, func(horizon string) []string) {
		s, err := New(admin, Config{Schema: schema})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		reader := connect("postgres")
		r, err := New(reader, Config{Schema: schema})
		require.NoError(t, err)
		return s, func(horizon string) []string {
			if horizon == "" {
				events, err := r.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
				require.NoError(t, err)
				return streams(events)
			}
			q := strings.NewReplacer("{events}", schema+".nudge_events", "{key}", s.sql.key).Replace(
				`SELECT ` + eventColumns + ` FROM {events} WHERE transaction_id < ` + horizon + ` ORDER BY transaction_id, global_position`)
			rows, err := reader.Query(ctx, q)
			require.NoError(t, err)
			events, err := collectEvents(rows, 4)
			require.NoError(t, err)
			return streams(events)
		}
	}
	appendTo := func(s *Store, stream string) {
		_, err := s.Append(ctx, stream, eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
		require.NoError(t, err)
	}

	t.Run("a writing transaction in another database", func(t *testing.T) {
		s, read := newStore("running")
		tx, err := other.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO report VALUES (1)`)
		require.NoError(t, err)
		appendTo(s, "a")
		require.Empty(t, read(clusterWide), "control: the cluster-wide horizon waits for the other database's transaction")
		require.Equal(t, []string{"a"}, read(""), "the event is read while the other database's transaction runs")
	})

	t.Run("a prepared transaction in another database", func(t *testing.T) {
		s, read := newStore("prepared")
		_, err := other.Exec(ctx, `BEGIN; INSERT INTO report VALUES (2); PREPARE TRANSACTION 'other'`)
		require.NoError(t, err)
		defer func() { _, _ = other.Exec(context.Background(), `ROLLBACK PREPARED 'other'`) }()

		// A prepared transaction of this database appended "p" before "q" committed.
		tx, err := connect("postgres").Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, s.AllowPrepareTx(ctx, tx))
		_, err = s.AppendTx(ctx, tx, "p", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION 'here'`)
		require.NoError(t, err)
		committed := false
		defer func() {
			if !committed {
				_, _ = admin.Exec(context.Background(), `ROLLBACK PREPARED 'here'`)
			}
		}()
		appendTo(s, "q")

		require.Equal(t, []string{"q"}, read(byPID), "control: tied by pid, the prepared transactions share a group and this database's passes for the other's")
		require.Empty(t, read(""), "the reader waits for this database's prepared transaction")
		_, err = admin.Exec(ctx, `COMMIT PREPARED 'here'`)
		require.NoError(t, err)
		committed = true
		require.Empty(t, read(clusterWide), "control: the cluster-wide horizon waits for the other database's prepared transaction")
		require.Equal(t, []string{"p", "q"}, read(""), "the events are read while the other database's transaction is prepared")
	})

	t.Run("a transaction of this database that only took an id", func(t *testing.T) {
		s, read := newStore("idonly")
		tx, err := connect("postgres").Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
		require.NoError(t, err)
		appendTo(s, "m")
		require.Equal(t, []string{"m"}, read(noLockHere), "control: with no lock here, the transaction passes for another database's")
		require.Empty(t, read(""), "the reader waits for a transaction that shows no database")
		_, err = s.AppendTx(ctx, tx, "x", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, []string{"x", "m"}, read(""), "x, appended later, comes first in read order: a reader past m would have skipped it")
	})
}
