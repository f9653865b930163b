package readme_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeMaxBytes is the README's budget: what nudge is, how to try it, a tour, the guarantees,
// one performance table and the way into docs/ fit in it; the rest belongs in docs/.
const readmeMaxBytes = 15 * 1024

// TestReadmeFrontPage: README.md stays within its budget and keeps what a newcomer deciding
// in five minutes looks for.
func TestReadmeFrontPage(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	require.LessOrEqual(t, len(raw), readmeMaxBytes,
		"README.md is %d bytes, over its %d: move detail into docs/ and link to it", len(raw), readmeMaxBytes)
	for _, want := range []string{
		"make demo", "make test", // the two commands
		"## A 60-second tour", "## Guarantees, in short", "## Performance",
		"docs/performance.md",              // where every figure comes from
		"docs/tutorial/getting-started.md", // the newcomer's path
		"docs/operations/runbook.md",       // the operator's
		"docs/README.md",
	} {
		require.Contains(t, string(raw), want, "README.md lost %q", want)
	}
}
