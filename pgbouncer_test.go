package nudge_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgbouncertest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// bouncedPool opens a pool of up to maxConns connections through PgBouncer, preparing no
// statement by name, closed when t ends.
func bouncedPool(t *testing.T, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe // as default_query_exec_mode=cache_describe in the URL
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// ticketLog records each TicketRegistered event it applies: applied counts how often.
func ticketLog(t testing.TB) *projection.Projection {
	t.Helper()
	p, err := projection.New("ticket_log", projection.Config{InitFunc: func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_log (event_id uuid PRIMARY KEY, applied int NOT NULL)`)
		return err
	}}, projection.On("TicketRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ticket_log VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET applied = ticket_log.applied + 1`, e.ID)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestThroughPgBouncer: two services run through PgBouncer in transaction pooling mode — the
// event store, the projections (one partitioned, its partitions leased to both), the relay,
// the PostgreSQL-queue channel and the migrations all on a pool through it; only the
// listeners and the partition index build on direct connections (SessionConnect,
// ListenConnect). Appends from many goroutines reach every read model exactly once.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	b := pgbouncertest.Start(t, db.URL, pgbouncertest.Options{PoolSize: 8})
	logger := testlog.New(t)
	direct := db.NewPool(t, 8)
	const partitions = 4
	service := func(id string) running {
		pool := bouncedPool(t, b.URL, 12)
		ch, err := pgchannel.New(pool, pgchannel.Config{PollInterval: 20 * time.Millisecond, Logger: logger,
			TransactionPooling: true, ListenConnect: postgres.PoolConnect(direct)})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, ch.Close()) })
		return start(t, pool, nudge.Config{Channel: ch, Logger: logger, WorkerID: id,
			Projections:        []*projection.Projection{ticketListWith(t, projection.Config{Partitions: partitions}), ticketLog(t)},
			TransactionPooling: true, SessionConnect: postgres.PoolConnect(direct)}, false)
	}
	a, c := service("svc-a"), service("svc-b")
	require.Eventually(t, func() bool {
		return len(a.Worker().Owned("ticket_list")) == partitions/2 && len(c.Worker().Owned("ticket_list")) == partitions/2
	}, eventually, 10*time.Millisecond, "two partitions each, by leases through PgBouncer")

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n))
		return n == 4
	}, eventually, 10*time.Millisecond, "each service's relay and channel listen")

	const writers, each = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		client := []running{a, c}[w%2]
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("%d-%d", w, i)
				data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: id, Type: "bug"})
				if err == nil {
					_, err = client.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
				}
				if err != nil {
					t.Errorf("append %s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	const events = writers * each
	for _, table := range []string{"ticket_list", "ticket_log"} {
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
			return n == events
		}, eventually, 10*time.Millisecond, "%s: a row per event", table)
		var twice int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE applied <> 1`).Scan(&twice))
		require.Zero(t, twice, "%s: every event applied once", table)
	}
	require.NoError(t, c.WaitCaughtUp(ctx))
	// A session advisory lock left behind is held by a backend between transactions; the
	// workers' transaction-level locks (batches, leases, the relay) come and go meanwhile, and
	// a backend seen in pg_locks may have finished its transaction by the time pg_stat_activity
	// is read, so a left-behind lock is one that stays.
	var locks int
	require.Eventually(t, func() bool {
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND a.state = 'idle'
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks))
		return locks == 0
	}, eventually, 10*time.Millisecond, "no session advisory lock left behind on a server connection of PgBouncer's")
	st, err := a.RelayStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, st.LagEvents, "the relay published every event")
}

// TestTransactionPoolingRefusesSessions: told that its pool goes through a pooler in
// transaction mode, New (and the PostgreSQL-queue channel's New) refuses at start what needs a
// session, with an error matching postgres.ErrSessionNeeded that says what to set.
func TestTransactionPoolingRefusesSessions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	describing := bouncedPool(t, db.URL, 2) // a direct pool, with the exec mode a bounced one needs
	ps := []*projection.Projection{ticketList(t)}
	ch, err := pgchannel.New(describing, pgchannel.Config{DisableListen: true, TransactionPooling: true})
	require.NoError(t, err)

	_, err = nudge.New(db.Pool, nudge.Config{Projections: ps, TransactionPooling: true})
	require.ErrorIs(t, err, postgres.ErrSessionNeeded)
	require.ErrorIs(t, err, nudge.ErrInvalidConfig)
	require.ErrorContains(t, err, "default_query_exec_mode=cache_describe")

	_, err = nudge.New(describing, nudge.Config{Projections: ps, Channel: ch, TransactionPooling: true})
	require.ErrorIs(t, err, postgres.ErrSessionNeeded)
	require.ErrorContains(t, err, "SessionConnect")
	partitioned := []*projection.Projection{ticketListWith(t, projection.Config{Partitions: 4})}
	_, err = nudge.New(describing, nudge.Config{Projections: partitioned, TransactionPooling: true})
	require.ErrorIs(t, err, postgres.ErrSessionNeeded)
	require.ErrorContains(t, err, "ticket_list is partitioned")

	for name, cfg := range map[string]nudge.Config{
		"poll only":            {Projections: ps, Channel: ch, TransactionPooling: true, DisableListen: true},
		"direct session":       {Projections: partitioned, Channel: ch, TransactionPooling: true, SessionConnect: postgres.PoolConnect(db.Pool)},
		"no channel, no relay": {Projections: ps, TransactionPooling: true},
	} {
		_, err = nudge.New(describing, cfg)
		require.NoError(t, err, name)
	}

	_, err = pgchannel.New(db.Pool, pgchannel.Config{DisableListen: true, TransactionPooling: true})
	require.ErrorIs(t, err, postgres.ErrSessionNeeded)
	require.ErrorContains(t, err, "default_query_exec_mode")
	_, err = pgchannel.New(describing, pgchannel.Config{TransactionPooling: true})
	require.ErrorIs(t, err, postgres.ErrSessionNeeded)
	require.ErrorContains(t, err, "ListenConnect")
	_, err = pgchannel.New(describing, pgchannel.Config{TransactionPooling: true, ListenConnect: postgres.PoolConnect(db.Pool)})
	require.NoError(t, err)
}
