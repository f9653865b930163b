package gochannel_test

import (
	"github.com/stretchr/testify/require"

	"testing"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/channel/gochannel"
)

func TestSuite(t *testing.T) {
	t.Parallel()
	channeltest.Run(t, func(t *testing.T) (channel.Channel, channeltest.RestartFunc) {
		ch, err := gochannel.New(gochannel.Config{})
		require.NoError(t, err)
		return ch, nil // keeps nothing across a restart
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(gochannel.OutputChannelBufferDefault), gochannel.Config{}.WithDefaults().OutputChannelBuffer)
	require.NoError(t, gochannel.Config{}.WithDefaults().Validate())
	_, err := gochannel.New(gochannel.Config{OutputChannelBuffer: -1})
	require.ErrorIs(t, err, gochannel.ErrInvalidConfig)
	require.ErrorContains(t, err, "OutputChannelBuffer")
}
