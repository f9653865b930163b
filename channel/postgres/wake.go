package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// wakeBackoff is the subscriptions' watermill-sql BackoffManager: it is where a subscription
// waits after a poll that found no trigger. It waits for a wake-up: from the channel's listener
// (a notification of a queued trigger, or the listener's loss or return), or from the channel's
// sweep (queued triggers found by its one fallback poll, see sweep). While the listener listens
// that is all; while it does not, the wait ends after PollInterval too, and the subscription
// polls on its own. A subscription the sweep does not cover (none, in practice) falls back to
// ListeningPollInterval while the listener listens. The wait then returns 0, so the subscriber
// polls at once. Errors keep watermill-sql's default handling (RetryInterval).
//
// watermill-sql's subscriber calls HandleError between two polls, on the subscription's own
// goroutine, and sleeps for what it returns without a way to be woken: blocking here is the
// only way to wake it. A wake-up that arrives while a poll runs stays in its channel and ends
// the next wait at once, so none is lost.
type wakeBackoff struct {
	errs  wmsql.BackoffManager
	woken <-chan struct{}
	// nudged receives the sweep's wake-ups; swept is set once the sweep covers the
	// subscription.
	nudged        chan struct{}
	swept         atomic.Bool
	listening     func() bool
	poll, longish time.Duration
	// done is closed when the subscriber closes or a subscription's context ends: the wait
	// then returns at once, and later ones leave the sleep to watermill-sql, which sees both.
	done <-chan struct{}
	// waitingFunc: Config.waitingFunc.
	waitingFunc func(listening bool)
}

var _ wmsql.BackoffManager = (*wakeBackoff)(nil)

// HandleError implements wmsql.BackoffManager.
func (b *wakeBackoff) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if err != nil || !noMsg {
		return b.errs.HandleError(logger, noMsg, err)
	}
	wait, listening := b.poll, b.listening()
	if listening {
		wait = b.longish
	}
	if b.waitingFunc != nil {
		b.waitingFunc(listening)
	}
	select {
	case <-b.done:
		return wait
	default:
	}
	var timeout <-chan time.Time // nil: no timeout; the sweep polls for the subscription
	if !listening || !b.swept.Load() {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-b.woken:
	case <-b.nudged:
	case <-timeout:
	case <-b.done:
	}
	return 0
}

// subscriber is a watermill-sql subscriber whose waits a listener cuts short.
type subscriber struct {
	*wmsql.Subscriber
	stopOnce sync.Once
	done     chan struct{}
	// unsubscribe ends the listener subscription.
	unsubscribe func()
	// sweep, when the channel listens, covers the subscription's projection from Subscribe
	// until stop; wake is the subscription's wait.
	sweep    *sweep
	wake     *wakeBackoff
	sweeping string
	mu       sync.Mutex
}

var _ message.Subscriber = (*subscriber)(nil)

// Subscribe implements message.Subscriber.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	context.AfterFunc(ctx, s.stop)
	if kind, projection, err := parseTopic(topic); err == nil && kind == topicProjection && s.sweep != nil {
		s.mu.Lock()
		select {
		case <-s.done: // stopped already
		default:
			if s.sweeping == "" {
				s.sweeping = projection
				s.sweep.add(projection, s.wake)
			} else {
				// A second subscription of one subscriber shares its waits, and a wake-up
				// ends only one of them: both keep polling on their own.
				s.wake.swept.Store(false)
			}
		}
		s.mu.Unlock()
	}
	return s.Subscriber.Subscribe(ctx, topic)
}

// stop ends the waits on wake-ups.
func (s *subscriber) stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		close(s.done)
		if s.sweeping != "" {
			s.sweep.remove(s.sweeping, s.wake)
		}
		s.mu.Unlock()
		s.unsubscribe()
	})
}

// Close implements message.Subscriber.
func (s *subscriber) Close() error {
	s.stop()
	return s.Subscriber.Close()
}
