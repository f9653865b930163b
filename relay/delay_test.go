package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
)

// TestRelayReportsItsDelay: BatchFunc gets the report of the batch that published an event's
// trigger, named for the relay, with the event's relay delay in the database's clock: an
// event left unpublished for 300 ms is reported at 300 ms or more, and at most its age read
// after the report.
func TestRelayReportsItsDelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, store, backend := newBackend(t)
	res, err := store.Append(ctx, "ticket-1", eventstore.Any, eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{}`)})
	require.NoError(t, err)
	const minAge = 0.3
	age := func() float64 {
		var s float64
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8 FROM nudge_events`).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return age() >= minAge }, testwait.For(time.Minute), 20*time.Millisecond,
		"the database's clock to pass the event by 300 ms")

	reports := make(chan projection.BatchReport, 10)
	rl, err := relay.New(backend, &recordingPublisher{}, relay.Config{Logger: testlog.New(t),
		BatchFunc: func(b projection.BatchReport) { reports <- b }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	var b projection.BatchReport
	select {
	case b = <-reports:
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the relay reported no batch")
	}
	oldest := age()
	require.NoError(t, b.Err)
	require.Equal(t, relay.NameDefault, b.Projection)
	require.Equal(t, 1, b.Events)
	require.Equal(t, res.Last(), b.Position)
	require.Len(t, b.Staleness, 1, "one delay per event")
	require.GreaterOrEqual(t, b.Staleness[0].Seconds(), minAge)
	require.LessOrEqual(t, b.Staleness[0].Seconds(), oldest)
}
