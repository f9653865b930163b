package deadletter_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/apitest"
)

// TestAPIHasNoBackendHelpers keeps go doc of the package to what users call: the rules the
// stores share live in deadletter/internal/dlstore.
func TestAPIHasNoBackendHelpers(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"ParseStatus", "Replay", "ReplayTargets", "Statuses", "WithTracerProvider"}, apitest.Funcs(t, "."))
}
