package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
)

// BenchmarkResolvePassedNothingToDo measures what a worker adds to every catch-up that commits
// events: one ResolvePassed that finds nothing to heal, on a table holding 1,000 open dead
// letters of other projections and 100 of this one at later events.
func BenchmarkResolvePassedNothingToDo(b *testing.B) {
	s, _ := newStore(b, postgres.Config{})
	ctx := context.Background()
	for i := range 1100 {
		name := "other"
		if i < 100 {
			name = "tickets"
		}
		e := deadlettertest.EventEntry(name, uuid.New(), deadlettertest.Base())
		e.FailingEvent.Position = eventstore.Position{TransactionID: 1000, GlobalPosition: int64(1000 + i)}
		_, err := s.Add(ctx, e)
		require.NoError(b, err)
	}
	passed := eventstore.Position{TransactionID: 1000, GlobalPosition: 999}
	b.ResetTimer()
	for b.Loop() {
		n, err := s.ResolvePassed(ctx, "tickets", passed, time.Time{})
		if err != nil || n != 0 {
			b.Fatalf("ResolvePassed: %d, %v", n, err)
		}
	}
}
