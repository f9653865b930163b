package name_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/name"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"tickets", "ticket_list", "ticket-stats.v2", "a", "0day", strings.Repeat("x", 63), name.ReservedPrefix + "relay"} {
		require.NoError(t, name.Validate(ok), ok)
	}
	for _, bad := range []string{"", "Tickets", "ticket list", "_x", "-x", ".x", "x;DROP TABLE y", `x"y`, "x'y", "amq#", "x*", "tickets/all",
		"tïckets", strings.Repeat("x", 64)} {
		err := name.Validate(bad)
		require.ErrorIs(t, err, name.ErrInvalid, bad)
		var ne *name.Error
		require.ErrorAs(t, err, &ne, bad)
		require.Equal(t, bad, ne.Name)
		require.Contains(t, err.Error(), "invalid name")
	}
}
