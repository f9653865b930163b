package projection_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
)

// TestNewRefusesReservedNames: a projection cannot take the relay's name (nor any name of
// nudge's own), so it can never share the relay's position and status row.
func TestNewRefusesReservedNames(t *testing.T) {
	t.Parallel()
	handler := projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil })
	for _, n := range []string{"nudge-relay", "nudge-relay-amqp", name.ReservedPrefix + "x"} {
		_, err := projection.New(n, projection.Config{}, handler)
		require.ErrorIs(t, err, name.ErrInvalid, n)
		var ne *name.Error
		require.ErrorAs(t, err, &ne)
		require.Contains(t, ne.Reason, "kept for nudge's own projections", n)
	}
	for _, n := range []string{"nudge", "nudge_relay", "nudgeworks", "my-nudge-relay"} {
		_, err := projection.New(n, projection.Config{}, handler)
		require.NoError(t, err, n)
	}
}
