package nudge

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge/trigger"
)

// ErrNoChannel is returned by Run, RunRouter, RunBackground, AddHandlers and Replay of a client
// without a channel (Config.Channel nil): such a client appends, reads and reports status, and
// runs nothing.
var ErrNoChannel = errors.New("nudge: the client has no Channel (Config.Channel is nil): it appends, reads and reports status only; " +
	"give it a channel (channel/amqp, channel/postgres or channel/gochannel) to run the projections")

// noChannel stands in for the channel of a client without one: the worker needs a channel, and
// a client that runs nothing needs none. Declare has nothing to do — the processes that run
// the projections declare their subscriptions before their relays publish — and everything
// that would carry a trigger returns ErrNoChannel.
type noChannel struct{}

func (noChannel) Declare(context.Context, ...string) error { return nil }

func (noChannel) Publish(context.Context, trigger.Trigger) error { return ErrNoChannel }

func (noChannel) Subscriber(string) (message.Subscriber, string, error) { return nil, "", ErrNoChannel }

func (noChannel) Publisher() message.Publisher { return noPublisher{} }

func (noChannel) Durable() bool { return false }

func (noChannel) Close() error { return nil }

// noPublisher is noChannel's raw publisher.
type noPublisher struct{}

func (noPublisher) Publish(string, ...*message.Message) error { return ErrNoChannel }

func (noPublisher) Close() error { return nil }
