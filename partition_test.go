package nudge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
)

// TestPartitionedProjectionOnTwoClients: two services (clients on RabbitMQ, each with its own
// channel and WorkerID) run one projection of 4 partitions; with nothing but nudge.New, they
// share its partitions by leases — two each — and apply every event once.
func TestPartitionedProjectionOnTwoClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	logger := testlog.New(t)
	env := amqptest.New(t)
	const partitions = 4
	list := func() *projection.Projection {
		p, err := projection.New("ticket_list", projection.Config{Partitions: partitions,
			InitFunc: func(ctx context.Context, p projection.HookParams) error {
				_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_list (id text PRIMARY KEY, ticket_type text NOT NULL, applied int NOT NULL)`)
				return err
			},
		}, projection.On("TicketRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ticket_list VALUES ($1, $2, 1) ON CONFLICT (id) DO UPDATE SET applied = ticket_list.applied + 1`,
				e.Data.ID, e.Data.Type)
			return err
		}))
		require.NoError(t, err)
		return p
	}
	service := func(id string) running {
		ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName + "-" + id, Logger: logger})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, ch.Close()) })
		return start(t, db.Pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{list()}, Logger: logger, WorkerID: id}, false)
	}
	a, b := service("svc-a"), service("svc-b")
	require.Eventually(t, func() bool {
		return len(a.Worker().Owned("ticket_list")) == partitions/2 && len(b.Worker().Owned("ticket_list")) == partitions/2
	}, eventually, 10*time.Millisecond, "two partitions each")
	ls, err := lease.Leases(ctx, db.Pool, "", "ticket_list", partitions)
	require.NoError(t, err)
	owners := map[string]int{}
	for _, l := range ls {
		owners[l.Owner]++
	}
	require.Equal(t, map[string]int{"svc-a": 2, "svc-b": 2}, owners, "owned under the services' WorkerIDs")

	const tickets = 40
	for i := range tickets {
		data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: fmt.Sprint(i), Type: "bug"})
		require.NoError(t, err)
		_, err = a.Append(ctx, fmt.Sprintf("ticket-%d", i), eventstore.NoStream, data)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ticket_list WHERE applied = 1`).Scan(&n))
		return n == tickets
	}, eventually, 10*time.Millisecond, "every ticket once")
	require.NoError(t, b.WaitCaughtUp(ctx, "ticket_list"))
	st, err := b.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Len(t, st.Partitions, partitions)
	require.Equal(t, projection.ConditionCaughtUp, st.Condition())
}
