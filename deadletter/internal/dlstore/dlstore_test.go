package dlstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/dlstore"
	"github.com/nudgeworks/nudge/eventstore"
)

func TestFoldKey(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d")
	require.Equal(t, "0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d",
		dlstore.FoldKey(deadletter.Entry{MessageUUID: "m-1", FailingEvent: &eventstore.EventRef{ID: id}}),
		"a failing event folds by its id, whatever the message")
	require.Equal(t, "message:m-1", dlstore.FoldKey(deadletter.Entry{MessageUUID: "m-1"}))
	require.Equal(t, "message:", dlstore.FoldKey(deadletter.Entry{}))
}

func TestNormalizeEntry(t *testing.T) {
	t.Parallel()
	now := time.Date(2021, 1, 2, 3, 4, 5, 6789, time.FixedZone("X", 7200))
	e, err := dlstore.NormalizeEntry(deadletter.Entry{Projection: "tickets", Payload: []byte{}}, now)
	require.NoError(t, err)
	require.Equal(t, 1, e.Attempts)
	require.Equal(t, time.Date(2021, 1, 2, 1, 4, 5, 6000, time.UTC), e.At)
	require.Nil(t, e.Payload)

	_, err = dlstore.NormalizeEntry(deadletter.Entry{}, now)
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "Entry.Projection")
}

func TestNormalizeFilter(t *testing.T) {
	t.Parallel()
	f, err := dlstore.NormalizeFilter(deadletter.Filter{})
	require.NoError(t, err)
	require.Equal(t, deadletter.ListLimitDefault, f.Limit)

	_, err = dlstore.NormalizeFilter(deadletter.Filter{Limit: 20_000})
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	require.ErrorContains(t, err, "use 1 to 10000")
}

func TestNormalizePurge(t *testing.T) {
	t.Parallel()
	now := time.Date(2021, 1, 2, 3, 4, 5, 0, time.UTC)
	o, err := dlstore.NormalizePurge(deadletter.PurgeOptions{OlderThan: time.Hour}, now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-time.Hour), dlstore.Cutoff(o))
	_, err = dlstore.NormalizePurge(deadletter.PurgeOptions{OlderThan: -1}, now)
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	require.True(t, strings.Contains(err.Error(), "720h"), "the error gives an example")
}

func TestMatches(t *testing.T) {
	t.Parallel()
	r := deadletter.Record{Projection: "tickets", Status: deadletter.StatusFailed}
	require.True(t, dlstore.Matches(deadletter.Filter{}, r))
	require.True(t, dlstore.Matches(deadletter.Filter{Projection: "tickets", Status: []deadletter.Status{deadletter.StatusFailed}}, r))
	require.False(t, dlstore.Matches(deadletter.Filter{Projection: "other"}, r))
	require.False(t, dlstore.Matches(deadletter.Filter{Status: []deadletter.Status{deadletter.StatusResolved}}, r))
}

func TestNormalizeActor(t *testing.T) {
	t.Parallel()
	_, err := dlstore.NormalizeActor("Resolve's by", "  ")
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "Resolve's by is empty")
}
