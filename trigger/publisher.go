package trigger

import "context"

// Publisher sends a trigger to projections; every channel.Channel is one. The relay and
// dead-letter replay publish through it.
type Publisher interface {
	Publish(ctx context.Context, t Trigger) error
}
