package gochannel_test

import (
	"testing"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/channel/gochannel"
)

func TestSuite(t *testing.T) {
	t.Parallel()
	channeltest.Run(t, func(*testing.T) channel.Channel { return gochannel.New(gochannel.Config{}) })
}
