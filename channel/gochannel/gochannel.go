// Package gochannel is the in-process channel: Watermill's GoChannel, for the embedded demo and
// fast tests. Nothing is durable: a trigger published while a projection has no running
// consumer is lost (the worker's start-up catch-up and safety-net tick cover that).
//
// Every projection subscribes to the one trigger topic and gets its own copy of each trigger.
// Triggers addressed to one projection reach all of them; the others ignore it. GoChannel
// delivers concurrently; the projection runner serialises catch-ups itself.
package gochannel

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/trigger"
)

// Channel is the GoChannel channel.
type Channel struct {
	pubsub *gochannel.GoChannel
}

var _ channel.Channel = (*Channel)(nil)

// OutputChannelBufferDefault is the default Config.OutputChannelBuffer.
const OutputChannelBufferDefault = 64

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config it cannot use.
var ErrInvalidConfig = errors.New("gochannel: invalid config")

// Config configures a Channel.
type Config struct {
	// Logger for Watermill. Defaults to no logging.
	Logger watermill.LoggerAdapter
	// OutputChannelBuffer is each subscription's buffer. Defaults to OutputChannelBufferDefault.
	OutputChannelBuffer int64
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.OutputChannelBuffer = cmp.Or(cfg.OutputChannelBuffer, OutputChannelBufferDefault)
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.OutputChannelBuffer < 0 {
		return fmt.Errorf("%w: OutputChannelBuffer %d is negative", ErrInvalidConfig, cfg.OutputChannelBuffer)
	}
	return nil
}

// New returns a channel on a new GoChannel.
func New(cfg Config) (*Channel, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Channel{pubsub: gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: cfg.OutputChannelBuffer}, cfg.Logger)}, nil
}

// Declare implements channel.Channel. GoChannel has no topology; it only checks the names.
func (c *Channel) Declare(_ context.Context, projections ...string) error {
	for _, projection := range projections {
		if err := name.Validate(projection); err != nil {
			return err
		}
	}
	return nil
}

// Publish implements channel.Channel.
func (c *Channel) Publish(ctx context.Context, t trigger.Trigger) error {
	if t.Projection != "" {
		if err := name.Validate(t.Projection); err != nil {
			return err
		}
	}
	msg, err := trigger.NewMessage(t)
	if err != nil {
		return err
	}
	msg.SetContext(ctx)
	tracing.Inject(ctx, msg.Metadata) // the consumer's span is a child of ctx's
	if err := c.pubsub.Publish(channel.TriggerTopic, msg); err != nil {
		return fmt.Errorf("gochannel: publish trigger: %w", err)
	}
	return nil
}

// Subscriber implements channel.Channel. Every subscriber shares the channel's GoChannel:
// closing one ends nothing (a subscription ends with its context); Close closes the GoChannel.
func (c *Channel) Subscriber(projection string) (message.Subscriber, string, error) {
	if err := name.Validate(projection); err != nil {
		return nil, "", err
	}
	return subscriber{c.pubsub}, channel.TriggerTopic, nil
}

// subscriber is the shared GoChannel with a Close of its own that leaves it open, so that a
// router stopping one handler (or a worker giving a partition back) does not close every
// other subscription.
type subscriber struct{ message.Subscriber }

func (subscriber) Close() error { return nil }

// Publisher implements channel.Channel.
func (c *Channel) Publisher() message.Publisher { return c.pubsub }

// Durable implements channel.Channel: GoChannel keeps nothing.
func (c *Channel) Durable() bool { return false }

// Close implements channel.Channel.
func (c *Channel) Close() error { return c.pubsub.Close() }
