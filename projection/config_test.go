package projection_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// TestConfig: Config, RunnerConfig and PollerConfig fill their defaults in WithDefaults and
// refuse what cannot work in Validate, with an error matching ErrInvalidConfig that names the
// field.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := projection.Config{}.WithDefaults()
	require.Equal(t, projection.BatchSizeDefault, cfg.BatchSize)
	require.Equal(t, projection.MaxBatchDurationDefault, cfg.MaxBatchDuration)
	require.Equal(t, projection.BatchTimeoutDefault, cfg.BatchTimeout)
	require.NoError(t, cfg.Validate())
	require.Equal(t, 4*time.Minute, projection.Config{MaxBatchDuration: 2 * time.Minute}.WithDefaults().BatchTimeout,
		"the default outlasts a long MaxBatchDuration")
	for name, bad := range map[string]projection.Config{
		"BatchTimeout":     {MaxBatchDuration: time.Minute, BatchTimeout: time.Minute},
		"BatchSize":        {BatchSize: eventstore.ReadLimitMax + 1},
		"CrashLoopLimit":   {CrashLoopLimit: -1},
		"MaxBatchDuration": {MaxBatchDuration: -time.Second},
	} {
		err := bad.WithDefaults().Validate()
		require.ErrorIs(t, err, projection.ErrInvalidConfig, name)
		require.ErrorContains(t, err, name)
	}
	require.ErrorContains(t, projection.Config{}.Validate(), "BatchSize 0", "Validate checks cfg as it is")

	rcfg := projection.RunnerConfig{}.WithDefaults()
	require.NotNil(t, rcfg.Logger)
	require.NotNil(t, rcfg.NowFunc)
	require.NoError(t, rcfg.Validate())
	require.ErrorIs(t, projection.RunnerConfig{}.Validate(), projection.ErrInvalidConfig)

	pcfg := projection.PollerConfig{}.WithDefaults()
	require.Equal(t, projection.PollMinIntervalDefault, pcfg.MinInterval)
	require.Equal(t, projection.PollMaxIntervalDefault, pcfg.MaxInterval)
	require.Equal(t, projection.PollMaxFailureIntervalDefault, pcfg.MaxFailureInterval)
	require.Equal(t, pcfg.MinInterval, pcfg.MaxBusyInterval)
	require.NotNil(t, pcfg.Logger)
	require.NoError(t, pcfg.Validate())
	for name, bad := range map[string]projection.PollerConfig{
		"MinInterval negative":       {MinInterval: -time.Second},
		"MaxInterval below min":      {MinInterval: 10 * time.Second, MaxInterval: time.Second},
		"MaxFailureInterval too low": {MinInterval: time.Second, MaxFailureInterval: time.Millisecond},
		"MaxBusyInterval too low":    {MinInterval: time.Second, MaxBusyInterval: time.Millisecond},
	} {
		err := bad.WithDefaults().Validate()
		require.ErrorIs(t, err, projection.ErrInvalidConfig, name)
		require.ErrorContains(t, err, "MinInterval", name)
	}
}
