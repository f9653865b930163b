package postgres

import (
	"sync/atomic"

	"github.com/nudgeworks/nudge/eventstore"
)

// floor keeps the store's horizon from moving back. The horizon is conservative: a reader whose
// snapshot lists a transaction as running and whose scan of the lock table finds it committing
// (its locks under "<backend>/0", where nothing tells its database) counts it, even when it is
// one of another database that an earlier statement rightly passed. For that moment the horizon
// falls below events the store has already returned, and a read — a batch's, a park's re-read of
// the event it parks — would come back without them.
//
// An event that a horizon-bounded read (or Head) returned had a transaction id below that
// statement's horizon: every transaction with a lower id had ended, as that statement's snapshot
// saw it, or was exempt (of another database, or declared exempt before it could append). Nothing
// can commit below it afterwards, so every later read may read up to it whatever its own horizon
// says: the read statements take greatest(horizon, floor). Only ids returned through the horizon
// raise the floor (never a stream read's, nor an append's).
type floor struct {
	xid atomic.Uint64 // the highest transaction id seen below a horizon
}

// get is the statements' floor parameter: the first id not known to be below the horizon.
func (f *floor) get() uint64 { return f.xid.Load() + 1 }

// raise records that the events of transaction xid could be read.
func (f *floor) raise(xid uint64) {
	for {
		cur := f.xid.Load()
		if xid <= cur || f.xid.CompareAndSwap(cur, xid) {
			return
		}
	}
}

// saw raises the floor to the last of events, read in read order.
func (f *floor) saw(events []eventstore.Event) {
	if len(events) > 0 {
		f.raise(events[len(events)-1].Position.TransactionID)
	}
}
