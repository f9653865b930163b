package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// Notification channels. The migrations add statement-level triggers that send one
// notification on these channels per transaction that inserted rows (PostgreSQL folds identical
// notifications of one transaction into one and delivers them after the commit); the payload is
// the schema of the table.
const (
	// NotifyEvents is notified by every transaction that appends events (ComponentEvents).
	NotifyEvents = "nudge_events"
	// NotifyTriggers is notified by every transaction that queues triggers (ComponentQueue).
	NotifyTriggers = "nudge_channel_triggers"
)

// Defaults for ListenerConfig.
const (
	// ListenReconnectMinIntervalDefault is the first wait before the listener reconnects.
	ListenReconnectMinIntervalDefault = 100 * time.Millisecond
	// ListenReconnectMaxIntervalDefault caps the wait between reconnection attempts.
	ListenReconnectMaxIntervalDefault = 10 * time.Second
)

// ListenerConfig configures a Listener. Every field but Channel is optional.
type ListenerConfig struct {
	// Channel is the notification channel to LISTEN on: NotifyEvents or NotifyTriggers.
	Channel string
	// ReconnectMinInterval and ReconnectMaxInterval bound the exponential wait between
	// attempts to reconnect after the listening connection is lost. Default to
	// ListenReconnectMinIntervalDefault and ListenReconnectMaxIntervalDefault.
	ReconnectMinInterval, ReconnectMaxInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// AfterListenFunc, if set, is called each time LISTEN succeeded on a new connection, with
	// that connection's backend process id; tests use it to terminate the backend.
	AfterListenFunc func(p ListenParams)
}

// ListenParams describes a listening connection, for ListenerConfig.AfterListenFunc.
type ListenParams struct {
	Channel string
	// PID is the PostgreSQL backend process id of the listening connection.
	PID uint32
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg ListenerConfig) WithDefaults() ListenerConfig {
	cfg.ReconnectMinInterval = cmp.Or(cfg.ReconnectMinInterval, ListenReconnectMinIntervalDefault)
	cfg.ReconnectMaxInterval = cmp.Or(cfg.ReconnectMaxInterval, ListenReconnectMaxIntervalDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg
}

// ErrInvalidListenerConfig is matched (errors.Is) by the errors NewListener returns for a
// config or a dependency it cannot use.
var ErrInvalidListenerConfig = errors.New("postgres: invalid listener config")

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidListenerConfig.
func (cfg ListenerConfig) Validate() error {
	if cfg.Channel == "" {
		return fmt.Errorf("%w: Channel is empty; use %q or %q", ErrInvalidListenerConfig, NotifyEvents, NotifyTriggers)
	}
	if cfg.ReconnectMinInterval <= 0 || cfg.ReconnectMaxInterval < cfg.ReconnectMinInterval {
		return fmt.Errorf("%w: reconnect intervals must satisfy 0 < ReconnectMinInterval <= ReconnectMaxInterval (got %s, %s; 0 means the default)",
			ErrInvalidListenerConfig, cfg.ReconnectMinInterval, cfg.ReconnectMaxInterval)
	}
	return nil
}

// ErrListenerRunning is returned by a Run while another Run of the same Listener has not
// returned.
var ErrListenerRunning = errors.New("postgres: the listener runs already")

// ConnectFunc opens a connection of its own for a Listener, which closes it.
type ConnectFunc func(ctx context.Context) (*pgx.Conn, error)

// PoolConnect returns a ConnectFunc that takes a connection out of pool for good
// (pgxpool.Conn.Hijack): LISTEN needs a connection that no one else uses.
func PoolConnect(pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}) ConnectFunc {
	return func(ctx context.Context) (*pgx.Conn, error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return c.Hijack(), nil
	}
}

// Listener turns PostgreSQL notifications into wake-ups: it LISTENs on one channel on a
// dedicated connection and wakes every subscriber after each notification. It is the "woken,
// not polled" half of polling: subscribers keep a poll as a fallback, long while Listening
// reports true, short otherwise.
//
// When the connection is lost, Listening turns false and every subscriber is woken (so it
// drops to its short poll at once); the listener reconnects with exponential backoff, and
// once LISTEN runs again it wakes every subscriber once more, since notifications sent
// meanwhile were lost. A wake-up therefore never depends on a notification sent while nobody
// listened. It is safe for concurrent use.
type Listener struct {
	connect ConnectFunc
	cfg     ListenerConfig

	listening atomic.Bool
	running   atomic.Bool

	mu   sync.Mutex
	subs map[*chan struct{}]struct{}
}

// NewListener returns a listener that opens its connections with connect.
func NewListener(connect ConnectFunc, cfg ListenerConfig) (*Listener, error) {
	if connect == nil {
		return nil, fmt.Errorf("%w: NewListener needs a ConnectFunc (PoolConnect(pool), say)", ErrInvalidListenerConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Listener{connect: connect, cfg: cfg, subs: map[*chan struct{}]struct{}{}}, nil
}

// Subscribe returns a channel that receives a value after notifications (several
// notifications may fold into one value) and whenever Listening changes, and a function that
// ends the subscription.
func (l *Listener) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.subs[&ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, &ch)
		l.mu.Unlock()
	}
}

// Listening reports whether the listener is connected and LISTENing now, so a notification
// sent now would wake the subscribers.
func (l *Listener) Listening() bool { return l.listening.Load() }

// wakeAll wakes every subscriber; it never blocks.
func (l *Listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
}

// Run listens until ctx ends, reconnecting after every loss of the connection; then it returns
// nil. A Run while another has not returned yet fails with ErrListenerRunning.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return ErrListenerRunning
	}
	defer l.running.Store(false)
	wait := backoff.Exponential{Initial: l.cfg.ReconnectMinInterval, Max: l.cfg.ReconnectMaxInterval, Jitter: 0.2}
	log := l.cfg.Logger.With(slog.String("channel", l.cfg.Channel))
	for {
		listened, err := l.session(ctx)
		if l.listening.Swap(false) {
			l.wakeAll() // subscribers fall back to their short poll now
		}
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			wait.Reset()
		}
		next := wait.Next()
		log.WarnContext(ctx, "postgres: listening for notifications failed; polling meanwhile", slog.Any("error", err), slog.Duration("retry_in", next))
		if backoff.Sleep(ctx, next) != nil {
			return nil
		}
	}
}

// session connects, LISTENs and wakes the subscribers after each notification until the
// connection fails or ctx ends. listened says whether LISTEN succeeded.
func (l *Listener) session(ctx context.Context) (listened bool, err error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.cfg.Channel}.Sanitize()); err != nil {
		return false, fmt.Errorf("LISTEN %s: %w", l.cfg.Channel, err)
	}
	l.listening.Store(true)
	l.wakeAll() // whatever was notified while nobody listened
	if l.cfg.AfterListenFunc != nil {
		l.cfg.AfterListenFunc(ListenParams{Channel: l.cfg.Channel, PID: conn.PgConn().PID()})
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		l.wakeAll()
	}
}
