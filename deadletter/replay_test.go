package deadletter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/memory"
)

// A publish that fails is reported with what to do; the records are already marked, and a
// second replay nudges the projection.
func TestReplayPublishFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New(memory.Config{})
	r, err := s.Add(ctx, deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base))
	require.NoError(t, err)

	broker := errors.New("broker down")
	pub := &deadlettertest.Publisher{Err: broker}
	res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{Projection: "tickets"}, "ann", time.Time{})
	require.ErrorIs(t, err, broker)
	require.ErrorContains(t, err, "projection tickets")
	require.ErrorContains(t, err, "run the replay again")
	require.Equal(t, 1, res.Replayed)
	require.Empty(t, res.Projections)

	pub.Err = nil
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{r.ID}}, "ann", time.Time{})
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 1, Projections: []string{"tickets"}}, res)
	got, err := s.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, 2, got.Replays)
	require.WithinDuration(t, time.Now(), got.ReplayedAt, time.Minute, "now defaults to the time of the call")
}

// failingStore fails List.
type failingStore struct{ deadletter.Store }

func (failingStore) List(context.Context, deadletter.Filter) ([]deadletter.Record, error) {
	return nil, errors.New("connection refused")
}

func TestReplayStoreFails(t *testing.T) {
	t.Parallel()
	pub := &deadlettertest.Publisher{}
	_, err := deadletter.Replay(context.Background(), failingStore{memory.New(memory.Config{})}, pub,
		deadletter.ReplayFilter{All: true}, "ann", time.Time{})
	require.ErrorContains(t, err, "connection refused")
	require.Empty(t, pub.Triggers(), "nothing is published when the records cannot be read")
}

// A replay that is cancelled stops.
func TestReplayCancelled(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	_, err := s.Add(context.Background(), deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pub := &deadlettertest.Publisher{}
	_, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, "ann", time.Time{})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, pub.Triggers())
}
