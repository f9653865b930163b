package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimeoutScaleFromTheEnvironment(t *testing.T) {
	t.Setenv(timeoutScaleEnv, "")
	f, err := timeoutScaleDefault()
	require.NoError(t, err)
	require.Equal(t, 1.0, f)
	t.Setenv(timeoutScaleEnv, "2.5")
	f, err = timeoutScaleDefault()
	require.NoError(t, err)
	require.Equal(t, 2.5, f)
	t.Setenv(timeoutScaleEnv, "slow")
	_, err = timeoutScaleDefault()
	require.ErrorContains(t, err, timeoutScaleEnv)

	defer func(old float64) { timeoutScale = old }(timeoutScale)
	timeoutScale = 3
	require.Equal(t, 3*time.Minute, deadline(time.Minute))
}
