package memory_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/eventstore/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(_ *testing.T, limits eventstore.Limits) eventstore.Store {
		s, err := memory.New(memory.Config{Limits: limits})
		require.NoError(t, err)
		return s
	})
}

// TestConfig: WithDefaults fills every default, and New refuses a Config that cannot work with
// an error matching ErrInvalidConfig that names the field.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := memory.Config{Limits: eventstore.Limits{MaxEventBytes: 3}}.WithDefaults()
	require.NotNil(t, cfg.NowFunc)
	require.Equal(t, eventstore.Limits{MaxEventBytes: 3, MaxAppendBytes: 16 << 20, MaxAppendEvents: 10_000}, cfg.Limits)
	require.NoError(t, cfg.Validate())
	s, err := memory.New(memory.Config{Limits: eventstore.Limits{MaxEventBytes: 3}})
	require.NoError(t, err)
	require.Equal(t, cfg.Limits, s.Limits())

	cases := map[string]struct {
		cfg  memory.Config
		want string
	}{
		"negative limit": {memory.Config{Limits: eventstore.Limits{MaxEventBytes: -5}}, "Limits.MaxEventBytes: -5"},
		"append below event": {memory.Config{Limits: eventstore.Limits{MaxEventBytes: 10, MaxAppendBytes: 5}},
			"Limits.MaxAppendBytes: 5 is below MaxEventBytes"},
	}
	for name, c := range cases {
		_, err := memory.New(c.cfg)
		require.ErrorIs(t, err, memory.ErrInvalidConfig, name)
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, name) // the *ValidationError inside
		var verr *eventstore.ValidationError
		require.ErrorAs(t, err, &verr, name)
		require.ErrorContains(t, err, c.want, name)
	}
	require.ErrorIs(t, memory.Config{}.Validate(), memory.ErrInvalidConfig, "NowFunc unset without WithDefaults")
}
