package testwait_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
)

func TestScale(t *testing.T) {
	t.Setenv(testwait.ScaleEnv, "")
	require.Equal(t, time.Minute, testwait.For(time.Minute), "unset: the deadline as written")

	t.Setenv(testwait.ScaleEnv, "2.5")
	require.Equal(t, 150*time.Second, testwait.For(time.Minute))

	for _, bad := range []string{"0", "-1", "fast", "NaN", "1e9"} {
		t.Setenv(testwait.ScaleEnv, bad)
		require.PanicsWithValue(t,
			`testwait: NUDGE_TEST_TIMEOUT_SCALE="`+bad+`": set it to a positive number such as 2 or 0.5, or unset it`,
			func() { testwait.For(time.Second) })
	}
}

func TestContext(t *testing.T) {
	t.Setenv(testwait.ScaleEnv, "2")
	ctx := testwait.Context(t, time.Hour)
	deadline, ok := ctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(2*time.Hour), deadline, 30*time.Minute, "the deadline is scaled")
	require.NoError(t, ctx.Err())
}
