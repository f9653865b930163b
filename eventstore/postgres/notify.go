package postgres

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/postgres"
)

// deferNotify is the statement Append adds to its first round trip: the store's NOTIFY
// trigger (migration eventstore/0003) then skips the transaction, and Append notifies after
// the commit through the store's notifier.
const deferNotify = `SELECT set_config('nudge.notify_deferred', 'on', true)`

// notifyTimeout bounds one notification; a failed one only leaves listeners to their poll.
const notifyTimeout = 5 * time.Second

// notifier sends NOTIFY postgres.NotifyEvents after Append's commits, outside them: one at a
// time, in a transaction of its own that waits for no WAL flush, folding the appends
// that commit meanwhile into the next. An append never waits for it, and concurrent appends
// never take turns to commit because of it (as transactions that NOTIFY do).
//
// A process that dies between an append's commit and its notification leaves listeners to
// their fallback poll; nothing else is lost.
type notifier struct {
	db      postgres.DB
	payload string
	// state is notifierIdle, notifierRunning or notifierPending (running, and more appends
	// committed since the notification in flight was sent).
	state atomic.Int32
}

const (
	notifierIdle int32 = iota
	notifierRunning
	notifierPending
)

// signal says that an append committed. It never blocks.
func (n *notifier) signal() {
	for {
		switch n.state.Load() {
		case notifierIdle:
			if n.state.CompareAndSwap(notifierIdle, notifierRunning) {
				go n.run()
				return
			}
		case notifierRunning:
			if n.state.CompareAndSwap(notifierRunning, notifierPending) {
				return
			}
		default:
			return
		}
	}
}

// run notifies until no append committed since its last notification.
func (n *notifier) run() {
	for {
		n.notify()
		if n.state.CompareAndSwap(notifierRunning, notifierIdle) {
			return
		}
		n.state.Store(notifierRunning) // it was notifierPending: notify again
	}
}

// notify sends one notification in one round trip: the statement's own implicit transaction
// commits it, and, having written no WAL (the notification queue is not logged), that commit
// waits for no flush. A BEGIN and COMMIT around it would cost two more round trips.
func (n *notifier) notify() {
	ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
	defer cancel()
	_, _ = n.db.Exec(ctx, `SELECT pg_notify($1, $2)`, postgres.NotifyEvents, n.payload)
}

// AllowPrepareTx lets tx be prepared for two-phase commit (PREPARE TRANSACTION) after it
// appends: call it before tx's first AppendTx. PostgreSQL cannot prepare a transaction that
// sent a notification, and the store's trigger notifies listeners (the relay, pollers) of every
// append in the caller's transaction; in tx it does not, and listeners find its events at their
// next poll, or with the next notified append, once COMMIT PREPARED makes them readable. Until
// then the prepared transaction holds readers back like any open one (HorizonHolder names it).
// Without it, PREPARE TRANSACTION after AppendTx fails (0A000) and the transaction rolls back.
func (s *Store) AllowPrepareTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return &eventstore.ValidationError{Field: "tx", Index: -1, Reason: "nil transaction: AllowPrepareTx applies to the caller's transaction"}
	}
	_, err := tx.Exec(ctx, deferNotify)
	return s.translate(err)
}
