package deadletter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
)

func TestFoldKey(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d")
	require.Equal(t, "0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d",
		deadletter.FoldKey(deadletter.Entry{MessageUUID: "m-1", FailingEvent: &deadletter.FailingEvent{ID: id}}),
		"a failing event folds by its id, whatever the message")
	require.Equal(t, "message:m-1", deadletter.FoldKey(deadletter.Entry{MessageUUID: "m-1"}))
	require.Equal(t, "message:", deadletter.FoldKey(deadletter.Entry{}))
}

func TestNormalizeEntry(t *testing.T) {
	t.Parallel()
	now := time.Date(2021, 1, 2, 3, 4, 5, 6789, time.FixedZone("X", 7200))
	e, err := deadletter.NormalizeEntry(deadletter.Entry{Projection: "tickets", Payload: []byte{}}, now)
	require.NoError(t, err)
	require.Equal(t, 1, e.Attempts)
	require.Equal(t, time.Date(2021, 1, 2, 1, 4, 5, 6000, time.UTC), e.At)
	require.Nil(t, e.Payload)

	_, err = deadletter.NormalizeEntry(deadletter.Entry{}, now)
	require.ErrorIs(t, err, deadletter.ErrInvalidInput)
	require.ErrorContains(t, err, "Entry.Projection")
}

func TestCleanText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ok", deadletter.CleanText("ok"))
	require.Equal(t, "ab", deadletter.CleanText("a\x00b"))
	require.Equal(t, "a\uFFFDb", deadletter.CleanText("a\xff\xfeb"))
}

func TestNormalizeFilter(t *testing.T) {
	t.Parallel()
	f, err := deadletter.NormalizeFilter(deadletter.Filter{})
	require.NoError(t, err)
	require.Equal(t, deadletter.ListLimitDefault, f.Limit)

	_, err = deadletter.NormalizeFilter(deadletter.Filter{Limit: 20_000})
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	require.ErrorContains(t, err, "use 1 to 10000")
}

func TestNormalizePurge(t *testing.T) {
	t.Parallel()
	now := time.Date(2021, 1, 2, 3, 4, 5, 0, time.UTC)
	o, err := deadletter.NormalizePurge(deadletter.PurgeOptions{OlderThan: time.Hour}, now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-time.Hour), o.Cutoff())
	_, err = deadletter.NormalizePurge(deadletter.PurgeOptions{OlderThan: -1}, now)
	require.ErrorIs(t, err, deadletter.ErrInvalidFilter)
	require.True(t, strings.Contains(err.Error(), "720h"), "the error gives an example")
}
