package deadletter_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
)

func TestParseStatus(t *testing.T) {
	t.Parallel()
	for _, st := range deadletter.Statuses() {
		got, err := deadletter.ParseStatus(string(st))
		require.NoError(t, err)
		require.Equal(t, st, got)
	}
	_, err := deadletter.ParseStatus("Failed")
	require.ErrorIs(t, err, deadletter.ErrUnknownStatus)
	require.ErrorContains(t, err, "[failed replayed resolved]", "the error lists the statuses")

	require.True(t, deadletter.StatusFailed.Replayable())
	require.True(t, deadletter.StatusReplayed.Replayable())
	require.False(t, deadletter.StatusResolved.Replayable())
}
