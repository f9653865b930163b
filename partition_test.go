package nudge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	service := func(id string) running {
		ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName + "-" + id, Logger: logger})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, ch.Close()) })
		return start(t, db.Pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{ticketListWith(t, projection.Config{Partitions: partitions})}, Logger: logger, WorkerID: id}, false)
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
