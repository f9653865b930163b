package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
)

// TestRelayNameIsReserved: the relay's name is one no projection can take, and a relay name
// that a projection could take is refused.
func TestRelayNameIsReserved(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	pub := &recordingPublisher{}

	for _, name := range []string{"", relay.NameDefault, "nudge-relay-amqp"} {
		_, err := relay.New(backend, pub, relay.Config{Name: name})
		require.NoError(t, err, "relay name %q", name)
	}
	for _, name := range []string{"relay", "ticket_list", "nudge_relay"} {
		_, err := relay.New(backend, pub, relay.Config{Name: name})
		require.ErrorIs(t, err, relay.ErrInvalidConfig, name)
		require.ErrorContains(t, err, `must start with "nudge-"`)
	}
}

// TestConfig: WithDefaults fills every default; New refuses missing dependencies and a Config
// that cannot work with an error matching relay.ErrInvalidConfig that names the field.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := relay.Config{}.WithDefaults()
	require.Equal(t, relay.NameDefault, cfg.Name)
	require.Equal(t, relay.BatchSizeDefault, cfg.BatchSize)
	require.Equal(t, relay.MinIntervalDefault, cfg.MinInterval)
	require.Equal(t, relay.MaxIntervalDefault, cfg.MaxInterval)
	require.Equal(t, relay.MaxBusyIntervalDefault, cfg.MaxBusyInterval)
	require.NotNil(t, cfg.Logger)
	require.NoError(t, cfg.Validate())
	require.Equal(t, time.Second, relay.Config{MinInterval: time.Second}.WithDefaults().MaxBusyInterval)

	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	pub := &recordingPublisher{}
	_, err = relay.New(nil, pub, relay.Config{})
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
	_, err = relay.New(backend, nil, relay.Config{})
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
	_, err = relay.NewAppender(nil, nil)
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
	cases := map[string]relay.Config{
		"Name":        {Name: "relay"},
		"BatchSize":   {BatchSize: -1},
		"MinInterval": {MinInterval: -time.Millisecond},
		"MaxInterval": {MinInterval: time.Second, MaxInterval: time.Millisecond},
	}
	for field, bad := range cases {
		_, err := relay.New(backend, pub, bad)
		require.ErrorIs(t, err, relay.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field, field)
	}
}
