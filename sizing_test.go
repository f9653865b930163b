package nudge_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
)

// namedPool opens a pool of up to maxConns connections whose backends show application_name
// name in pg_stat_activity, closed when t ends.
func namedPool(t *testing.T, url, name string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// slowTickets is a projection whose handler holds its batch's connection a little, so the
// pools fill up under load.
// It records in locks the most locks a batch held (pg_locks of its backend).
func slowTickets(t testing.TB, locks *atomic.Int64) *projection.Projection {
	t.Helper()
	p, err := projection.New("slow_tickets", projection.Config{BatchSize: 5, InitFunc: func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS slow_tickets (event_id uuid PRIMARY KEY)`)
		return err
	}}, projection.On("TicketRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
		var held int64
		err := tx.QueryRow(ctx, `WITH ins AS (INSERT INTO slow_tickets SELECT $1 FROM pg_sleep(0.002))
			SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()`, e.ID).Scan(&held)
		for cur := locks.Load(); held > cur && !locks.CompareAndSwap(cur, held); cur = locks.Load() {
		}
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestConnectionsPerWorker checks the sizing formula of docs/operations/pgbouncer-and-sizing.md
// against a worker under load: its PostgreSQL connections, counted in pg_stat_activity by
// application_name, never exceed
//
//	client pool:  MaxConns + 1 (the relay's listener, taken out of it) + 2 (the lease pool, a copy of it)
//	channel pool: MaxConns + 1 (the channel's listener, taken out of it)
//
// and reach more than the pools' MaxConns: the listeners and the lease pool come on top.
func TestConnectionsPerWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const clientMax, channelMax = 6, 8
	pool := namedPool(t, db.URL, "sizing_client", clientMax)
	chPool := namedPool(t, db.URL, "sizing_channel", channelMax)
	logger := testlog.New(t)
	var locks atomic.Int64
	ch, err := pgchannel.New(chPool, pgchannel.Config{PollInterval: 20 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	// Subscriptions: slow_tickets, ticket_log, ticket_list and its 4 partitions: 7 < channelMax.
	w := start(t, pool, nudge.Config{Channel: ch, Logger: logger,
		Projections: []*projection.Projection{ticketListWith(t, projection.Config{Partitions: 4}), ticketLog(t), slowTickets(t, &locks)}}, false)

	peak := map[string]int{}
	sampled := make(chan struct{})
	sampleCtx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			rows, err := db.Pool.Query(sampleCtx, `SELECT application_name, count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name LIKE 'sizing_%' GROUP BY 1`)
			if err != nil {
				return
			}
			for rows.Next() {
				var name string
				var n int
				if rows.Scan(&name, &n) == nil {
					peak[name] = max(peak[name], n)
				}
			}
			rows.Close()
		}
	}()

	const writers, each = 12, 20
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("%d-%d", g, i)
				data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: id, Type: "bug"})
				if err == nil {
					_, err = w.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
				}
				if err != nil {
					t.Errorf("append %s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM slow_tickets`).Scan(&n))
		return n == writers*each
	}, eventually, 10*time.Millisecond, "every event projected")
	require.NoError(t, w.WaitCaughtUp(ctx))
	stopSampling()
	<-sampled
	t.Logf("peak connections: client pool %d (MaxConns %d), channel pool %d (MaxConns %d)",
		peak["sizing_client"], clientMax, peak["sizing_channel"], channelMax)
	require.LessOrEqual(t, peak["sizing_client"], clientMax+1+2, "client pool + relay listener + lease pool")
	require.LessOrEqual(t, peak["sizing_channel"], channelMax+1, "channel pool + channel listener")
	require.Greater(t, peak["sizing_client"]+peak["sizing_channel"], clientMax,
		"the listeners and the lease pool come on top of the pools")
	t.Logf("most locks a batch held: %d", locks.Load())
	require.Less(t, locks.Load(), int64(64), "well within max_locks_per_transaction's default, 64")
}
