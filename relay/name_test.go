package relay_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
)

// TestRelayNameIsReserved: the relay's name is one no projection can take, and a relay name
// that a projection could take is refused.
func TestRelayNameIsReserved(t *testing.T) {
	t.Parallel()
	backend, err := memory.New(memstore.New(memstore.Config{}), memory.Config{})
	require.NoError(t, err)
	pub := &recordingPublisher{}

	for _, name := range []string{"", relay.NameDefault, "nudge-relay-amqp"} {
		_, err := relay.New(backend, pub, relay.Config{Name: name})
		require.NoError(t, err, "relay name %q", name)
	}
	for _, name := range []string{"relay", "ticket_list", "nudge_relay"} {
		_, err := relay.New(backend, pub, relay.Config{Name: name})
		require.ErrorIs(t, err, projection.ErrInvalidConfig, name)
		require.ErrorContains(t, err, `must start with "nudge-"`)
	}
}
