package memory_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/memory"
)

func TestSuite(t *testing.T) {
	t.Parallel()
	deadlettertest.Run(t, func(*testing.T) deadletter.Store { return memory.New(memory.Config{}) })
}

// TestConfig: WithDefaults fills NowFunc and keeps one that is set; Validate refuses a Config
// it was not applied to.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := memory.Config{}.WithDefaults()
	require.NotNil(t, cfg.NowFunc)
	require.NoError(t, cfg.Validate())
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.Equal(t, fixed, memory.Config{NowFunc: func() time.Time { return fixed }}.WithDefaults().NowFunc())
	require.ErrorIs(t, memory.Config{}.Validate(), memory.ErrInvalidConfig)
}
