package namecheck_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/namecheck"
)

func TestProblem(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"TicketWasRegistered":   "",
		"ticket-1":              "",
		"":                      "empty",
		" \t":                   "empty",
		strings.Repeat("x", 21): "21 bytes long; at most 20 allowed",
		"a\xffb":                "UTF-8",
		"a\x00b":                "NUL",
	} {
		got := namecheck.Problem(s, 20)
		if want == "" {
			require.Empty(t, got, "%q", s)
			continue
		}
		require.Contains(t, got, want, "%q", s)
	}
}
