package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// wakeBackoff is the subscriptions' watermill-sql BackoffManager: it is where a subscription
// waits after a poll that found no trigger, and it waits for a wake-up from the channel's
// listener (a notification of a queued trigger) or, as a fallback, for the poll interval —
// ListeningPollInterval while the listener listens, PollInterval while it does not. It then
// returns 0, so the subscriber polls at once. Errors keep watermill-sql's default handling
// (RetryInterval).
//
// watermill-sql's subscriber calls HandleError between two polls, on the subscription's own
// goroutine, and sleeps for what it returns without a way to be woken: blocking here is the
// only way to wake it. A wake-up that arrives while a poll runs stays in the channel and ends
// the next wait at once, so none is lost.
type wakeBackoff struct {
	errs          wmsql.BackoffManager
	woken         <-chan struct{}
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
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-b.woken:
	case <-t.C:
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
}

var _ message.Subscriber = (*subscriber)(nil)

// Subscribe implements message.Subscriber.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	context.AfterFunc(ctx, s.stop)
	return s.Subscriber.Subscribe(ctx, topic)
}

// stop ends the waits on wake-ups.
func (s *subscriber) stop() {
	s.stopOnce.Do(func() {
		close(s.done)
		s.unsubscribe()
	})
}

// Close implements message.Subscriber.
func (s *subscriber) Close() error {
	s.stop()
	return s.Subscriber.Close()
}
