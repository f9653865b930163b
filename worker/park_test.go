package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// parkedTicketList is the seed scenario's ticket_list with OnFailure park: a stream parks on
// the trigger's last attempt (ParkAfterAttempts = the worker's Retry.MaxAttempts).
func parkedTicketList(t testing.TB, attempts int) *projection.Projection {
	t.Helper()
	list, err := projection.New("ticket_list", projection.Config{
		OnFailure:         projection.OnFailurePark,
		ParkAfterAttempts: attempts,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_list (
				id text PRIMARY KEY, ticket_type varchar(25) NOT NULL, status text NOT NULL, applied int NOT NULL)`)
			return err
		},
	},
		projection.On("TicketWasRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ticket_list VALUES ($1, $2, 'open', 1)
				ON CONFLICT (id) DO UPDATE SET applied = ticket_list.applied + 1`, e.Data.ID, e.Data.Type)
			return err
		}),
		projection.On("TicketWasClosed", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketClosed]) error {
			// Fails when the ticket is missing, so a close applied before its registration shows.
			tag, err := tx.Exec(ctx, `UPDATE ticket_list SET status = 'closed', applied = applied + 1 WHERE id = $1`, e.Data.ID)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("ticket %s closed before it was registered", e.Data.ID)
			}
			return err
		}))
	require.NoError(t, err)
	return list
}

// TestTicketScenarioParked is the seed scenario with ticket_list in park mode, on RabbitMQ and
// on the PostgreSQL queue: the 30-character ticket type parks ticket 6's stream (its close is
// held behind it) and no trigger is dead-lettered; every other ticket keeps flowing into
// ticket_list; after the column is widened and the worker restarted, ticket 6 appears with
// both its events, in order, each applied once.
func TestTicketScenarioParked(t *testing.T) {
	t.Parallel()
	for _, channelName := range []string{"amqp", "postgres"} {
		t.Run(channelName, func(t *testing.T) {
			t.Parallel()
			ticketScenarioParked(t, channelName)
		})
	}
}

func ticketScenarioParked(t *testing.T, channelName string) {
	ctx := context.Background()
	s := newSetup(t)
	ch := s.newChannel(t, channels[channelName])
	dead, err := dlpg.New(s.db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(ctx))
	const attempts = 3
	cfg := worker.Config{
		SafetyNetInterval: -1, // only triggers and restarts move the projection here
		Retry:             retry.Policy{MaxAttempts: attempts, InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		DeadLetters:       dead,
	}
	_, stop := s.startStoppable(t, ch, cfg, parkedTicketList(t, attempts))
	t.Cleanup(func() { require.NoError(t, ch.Close()) })

	for i := 1; i <= 5; i++ {
		s.register(t, fmt.Sprint(i), "bug")
	}
	longType := strings.Repeat("x", 30)
	s.register(t, "6", longType)
	s.closeTicket(t, "6")
	for i := 7; i <= 10; i++ {
		s.register(t, fmt.Sprint(i), "question")
	}
	for i := 1; i <= 3; i++ {
		s.closeTicket(t, fmt.Sprint(i))
	}
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM ticket_list`) == 9 &&
			s.scalar(t, `SELECT count(*) FROM ticket_list WHERE status = 'closed'`) == 3
	}, eventually, 10*time.Millisecond, "every other ticket flows past the parked one")
	require.Zero(t, s.scalar(t, `SELECT count(*) FROM ticket_list WHERE id = '6'`))
	var parked int
	require.Eventually(t, func() bool {
		parked = s.scalar(t, `SELECT count(*) FROM nudge_projection_parked WHERE projection = 'ticket_list' AND stream_id = 'ticket-6'`)
		return parked == 1 && s.scalar(t, `SELECT held_events FROM nudge_projection_parked WHERE stream_id = 'ticket-6'`) == 1
	}, eventually, 10*time.Millisecond, "ticket 6's stream is parked, its close held")
	var parkedErr string
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT error FROM nudge_projection_parked`).Scan(&parkedErr))
	require.Contains(t, parkedErr, "value too long")
	recs, err := dead.List(ctx, deadletter.Filter{Projection: "ticket_list"})
	require.NoError(t, err)
	require.Empty(t, recs, "parked, not dead-lettered")

	// The fix, then a restart: the worker redrives the parked stream at start.
	_, err = s.db.Pool.Exec(ctx, `ALTER TABLE ticket_list ALTER COLUMN ticket_type TYPE varchar(100)`)
	require.NoError(t, err)
	stop()
	s.startStoppable(t, ch, cfg, parkedTicketList(t, attempts))
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM ticket_list WHERE id = '6' AND status = 'closed'`) == 1
	}, eventually, 10*time.Millisecond, "ticket 6 appears with both its events")
	require.Equal(t, 10, s.scalar(t, `SELECT count(*) FROM ticket_list`))
	require.Zero(t, s.scalar(t, `SELECT count(*) FROM ticket_list WHERE applied <> CASE WHEN status = 'closed' THEN 2 ELSE 1 END`),
		"each event applied exactly once")
	require.Zero(t, s.scalar(t, `SELECT count(*) FROM nudge_projection_parked`))
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM nudge_projection_park_actions WHERE action = 'redrive' AND done_by = 'worker start'`))
}
