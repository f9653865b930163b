package main

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/projection"
	pgprojection "github.com/nudgeworks/nudge/projection/postgres"
)

// benchTickets is how many tickets BenchmarkTicketStatsRebuild registers and closes.
const benchTickets = 5000

// BenchmarkTicketStatsRebuild rebuilds ticket_stats (reset, then catch up from the start) over
// benchTickets tickets, each registered and closed (2 × benchTickets events, 50 customers):
// "flush" is the projection as the service defines it (set-based, in the flush hook), "on" the
// same read model written event by event with projection.On.
//
//	go test -run '^$' -bench TicketStatsRebuild -benchtime 3x ./examples/tickets/
func BenchmarkTicketStatsRebuild(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(b, err)
	backend, err := pgprojection.New(store)
	require.NoError(b, err)
	require.NoError(b, store.Migrate(ctx))
	require.NoError(b, backend.Migrate(ctx))
	loadTickets(b, store, benchTickets)

	log := slog.New(slog.DiscardHandler)
	flush, err := newReadModels("", TitleWidthDefault, log).ticketStats()
	require.NoError(b, err)
	onModels := readModels{log: log, stats: "ticket_stats_on", statsTickets: "ticket_stats_on_tickets"}
	perEvent, err := onModels.ticketStatsPerEvent()
	require.NoError(b, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: log}, flush, perEvent)
	require.NoError(b, err)
	require.NoError(b, runner.Init(ctx))

	for _, p := range []*projection.Projection{flush, perEvent} {
		name := map[string]string{flush.Name(): "flush", perEvent.Name(): "on"}[p.Name()]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				require.NoError(b, runner.Reset(ctx, p.Name()))
				res, err := runner.CatchUp(ctx, p.Name())
				require.NoError(b, err)
				require.Equal(b, 2*benchTickets, res.Events)
			}
			b.ReportMetric(float64(2*benchTickets*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}

	// Both wrote the same counts: the benchmark compares two correct read models.
	var differ int
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ticket_stats f FULL JOIN ticket_stats_on o USING (customer)
		WHERE f.open IS DISTINCT FROM o.open OR f.closed IS DISTINCT FROM o.closed OR o.closed <> `+fmt.Sprint(benchTickets/50)).Scan(&differ))
	require.Zero(b, differ)
}

// loadTickets registers and closes n tickets, 500 to a transaction.
func loadTickets(b *testing.B, store *espg.Store, n int) {
	b.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 500 {
		require.NoError(b, store.RunInTx(ctx, func(tx pgx.Tx) error {
			for i := start; i < min(start+500, n); i++ {
				id := uuid.NewString()
				reg, err := eventstore.NewEventData(TypeTicketRegistered, TicketRegistered{ID: id, Title: "t", Customer: fmt.Sprintf("customer-%02d", i%50)})
				if err != nil {
					return err
				}
				closed, err := eventstore.NewEventData(TypeTicketClosed, TicketClosed{ID: id, Reason: "done"})
				if err != nil {
					return err
				}
				if _, err := store.AppendTx(ctx, tx, streamID(id), eventstore.NoStream, reg, closed); err != nil {
					return err
				}
			}
			return nil
		}))
	}
}

// ticketStatsPerEvent is ticket_stats written event by event with projection.On: what the
// flush hook replaces.
func (m readModels) ticketStatsPerEvent() (*projection.Projection, error) {
	hooks, err := m.ticketStats()
	if err != nil {
		return nil, err
	}
	return projection.New("ticket_stats_on", projection.Config{InitFunc: hooks.Config().InitFunc, ResetFunc: hooks.Config().ResetFunc},
		// One statement (one round trip) per event, each a data-modifying CTE.
		projection.On(TypeTicketRegistered, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketRegistered]) error {
			_, err := tx.Exec(ctx, `WITH t AS (INSERT INTO `+m.statsTickets+` (id, customer) VALUES ($1, $2) RETURNING customer)
				INSERT INTO `+m.stats+` AS s (customer, open, closed) SELECT customer, 1, 0 FROM t
				ON CONFLICT (customer) DO UPDATE SET open = s.open + 1`, e.Data.ID, e.Data.Customer)
			return err
		}),
		projection.On(TypeTicketClosed, func(ctx context.Context, tx pgx.Tx, e projection.Event[TicketClosed]) error {
			_, err := tx.Exec(ctx, `WITH t AS (UPDATE `+m.statsTickets+` SET closed = true WHERE id = $1 AND NOT closed RETURNING customer)
				UPDATE `+m.stats+` AS s SET open = s.open - 1, closed = s.closed + 1 FROM t WHERE s.customer = t.customer`, e.Data.ID)
			return err
		}),
	)
}
