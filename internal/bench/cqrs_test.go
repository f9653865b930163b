package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/relay"
)

// TestMain lets the test binary run a consumer of the cqrs scenario, as the bench binary does:
// the fault runs start consumers by running their own executable.
func TestMain(m *testing.M) {
	if spec := os.Getenv(cqrsChildEnv); spec != "" {
		os.Exit(runCQRSChild(spec))
	}
	os.Exit(m.Run())
}

// TestCQRSFaultsAreRealAndCounted: the cqrs scenario's fault runs SIGKILL real consumer
// processes between their write and their ack and fail real publishes after the store's
// commit, and count the outcome from the tables. On the PostgreSQL queue the CQRS processor
// applies events twice after a kill and loses exactly the events whose publish failed; nudge,
// under the same faults, does neither.
func TestCQRSFaultsAreRealAndCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := testlog.New(t)
	h, err := newHarness(ctx, options{postgresURL: pgtest.URL(), amqpURL: amqptest.URL(), pgPoll: 10 * time.Millisecond,
		relayInterval: relay.MinIntervalDefault}, log, log)
	require.NoError(t, err)
	t.Cleanup(h.close)
	cs := cqrsSizes{rate: 1000, writers: 2, streams: 10, faultEvents: 200}

	got, err := h.runCQRSFault(ctx, systemCQRS, chPostgres, 1, 0, cs)
	require.NoError(t, err)
	require.Equal(t, int64(200), got.appended)
	require.Equal(t, int64(1), got.kills)
	require.Positive(t, got.duplicated, "the message whose row committed before the kill comes back")
	require.Zero(t, got.lost)

	got, err = h.runCQRSFault(ctx, systemCQRS, chPostgres, 0, 3, cs)
	require.NoError(t, err)
	require.Equal(t, faultResult{appended: 200, failedPublishes: 3, lost: 3}, got)

	got, err = h.runCQRSFault(ctx, systemNudge, chPostgres, 1, 0, cs)
	require.NoError(t, err)
	require.Equal(t, faultResult{appended: 200, kills: 1}, got)

	got, err = h.runCQRSFault(ctx, systemNudge, chPostgres, 0, 3, cs)
	require.NoError(t, err)
	require.Equal(t, faultResult{appended: 200, failedPublishes: 3}, got)
}

// TestCountFaultsCountsFromTheTables: the cqrs scenario's figures come from the store's events
// against the read model's rows: a second row of an event is one event applied twice, an event
// without a row is one lost, and rows of events the store does not hold (the drain marker) count
// as neither.
func TestCountFaultsCountsFromTheTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(activityDDL, pgx.Identifier{activityName}.Sanitize()))
	require.NoError(t, err)
	var ids []any
	for i := range 4 {
		data, err := eventstore.NewEventData("TicketWasUpdated", livePayload{N: i})
		require.NoError(t, err)
		res, err := store.Append(ctx, fmt.Sprintf("ticket-%d", i), eventstore.NoStream, data)
		require.NoError(t, err)
		ids = append(ids, res.Events[0].ID)
	}
	insert := fmt.Sprintf(activityInsert, pgx.Identifier{activityName}.Sanitize())
	// Event 0 applied three times, event 1 twice, event 2 once, event 3 never; and a marker.
	for _, id := range []any{ids[0], ids[0], ids[0], ids[1], ids[1], ids[2], "00000000-0000-0000-0000-000000000001"} {
		_, err := db.Pool.Exec(ctx, insert, id, "s", 1)
		require.NoError(t, err)
	}
	got, err := countFaults(ctx, &fixture{db: &database{pool: db.Pool}}, activityName)
	require.NoError(t, err)
	require.Equal(t, faultResult{appended: 4, duplicated: 3, lost: 1}, got)
}

// TestInjectorFailsEveryNthCallUpToItsLimit: the failed publishes of a run are exactly the
// planned ones.
func TestInjectorFailsEveryNthCallUpToItsLimit(t *testing.T) {
	t.Parallel()
	inj := &injector{every: 3, limit: 2}
	var hits []int
	for call := 1; call <= 12; call++ {
		if inj.hit() {
			hits = append(hits, call)
		}
	}
	require.Equal(t, []int{3, 6}, hits)
	require.Equal(t, 2, inj.count())
	none := &injector{every: 3, limit: 0}
	for range 6 {
		require.False(t, none.hit())
	}
}
