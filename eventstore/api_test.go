package eventstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/apitest"
)

// TestAPIHasNoBackendHelpers keeps go doc of the package to what users call: the checks the
// stores share live in internal/storecheck.
func TestAPIHasNoBackendHelpers(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"Exact", "NewEventData", "ParsePosition", "PartitionKey", "PartitionOf"}, apitest.Funcs(t, "."))
}
