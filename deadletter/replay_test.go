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
	r, err := s.Add(ctx, deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base()))
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
	// A store may keep whole microseconds (PostgreSQL does): the bounds are widened to them.
	before := time.Now().Truncate(time.Microsecond)
	res, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{r.ID}}, "ann", time.Time{})
	after := time.Now().Truncate(time.Microsecond).Add(time.Microsecond)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReplayResult{Replayed: 1, Projections: []string{"tickets"}}, res)
	got, err := s.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, 2, got.Replays)
	require.False(t, got.ReplayedAt.Before(before) || got.ReplayedAt.After(after),
		"now defaults to the time of the call: %s is not within [%s, %s]", got.ReplayedAt, before, after)
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
	_, err := s.Add(context.Background(), deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pub := &deadlettertest.Publisher{}
	_, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{All: true}, "ann", time.Time{})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, pub.Triggers())
}

// ReplayTargets names the projections a replay would trigger, without changing a record.
func TestReplayTargets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New(memory.Config{})
	var ids []int64
	for _, name := range []string{"tickets", "orders", "tickets", "invoices"} {
		r, err := s.Add(ctx, deadlettertest.EventEntry(name, uuid.New(), deadlettertest.Base()))
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	require.NoError(t, s.Resolve(ctx, ids[3], "ann", "", time.Time{}))

	for _, tc := range []struct {
		filter deadletter.ReplayFilter
		want   []string
	}{
		{deadletter.ReplayFilter{All: true}, []string{"orders", "tickets"}},
		{deadletter.ReplayFilter{All: true, PageSize: 1}, []string{"orders", "tickets"}},
		{deadletter.ReplayFilter{Projection: "tickets"}, []string{"tickets"}},
		{deadletter.ReplayFilter{Projection: "invoices"}, nil},
		{deadletter.ReplayFilter{IDs: []int64{ids[2], ids[3]}}, []string{"tickets"}},
	} {
		got, err := deadletter.ReplayTargets(ctx, s, tc.filter)
		require.NoError(t, err, tc.filter)
		require.Equal(t, tc.want, got, tc.filter)
	}
	_, err := deadletter.ReplayTargets(ctx, s, deadletter.ReplayFilter{IDs: []int64{ids[0], 99}})
	require.ErrorIs(t, err, deadletter.ErrNotFound)
	_, err = deadletter.ReplayTargets(ctx, s, deadletter.ReplayFilter{})
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)

	recs, err := s.List(ctx, deadletter.Filter{})
	require.NoError(t, err)
	for _, r := range recs {
		require.Zero(t, r.Replays, "nothing was marked")
	}
}

// TestReplayFailedBefore: a replay with FailedBefore leaves alone the records that failed at
// or after it (a worker's own first dead letters at its start), and names no projection for
// them; FailedBefore does not go with IDs.
func TestReplayFailedBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New(memory.Config{})
	base := deadlettertest.Base()
	old, err := s.Add(ctx, deadlettertest.EventEntry("tickets", uuid.New(), base))
	require.NoError(t, err)
	fresh, err := s.Add(ctx, deadlettertest.EventEntry("tickets", uuid.New(), base.Add(time.Minute)))
	require.NoError(t, err)
	_, err = s.Add(ctx, deadlettertest.EventEntry("orders", uuid.New(), base.Add(time.Minute)))
	require.NoError(t, err)

	f := deadletter.ReplayFilter{All: true, FailedBefore: base.Add(time.Second)}
	targets, err := deadletter.ReplayTargets(ctx, s, f)
	require.NoError(t, err)
	require.Equal(t, []string{"tickets"}, targets)
	pub := &deadlettertest.Publisher{}
	res, err := deadletter.Replay(ctx, s, pub, f, "worker start", base.Add(2*time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	require.Equal(t, []string{"tickets"}, res.Projections)
	got, err := s.Get(ctx, old.ID)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusReplayed, got.Status)
	got, err = s.Get(ctx, fresh.ID)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusFailed, got.Status, "failed after FailedBefore: left alone")

	_, err = deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{IDs: []int64{old.ID}, FailedBefore: base}, "ann", time.Time{})
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
}
