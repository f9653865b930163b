package eventstore

import (
	"fmt"
	"strings"
	"time"
)

// HorizonHolder is the open transaction that keeps committed events unreadable: readers never
// skip an event of a transaction that may still commit, so they wait for the oldest one. An
// operator ends the wait by ending that transaction (commit, roll back, or
// pg_terminate_backend(PID) in PostgreSQL).
type HorizonHolder struct {
	// TransactionID is the holding transaction's id.
	TransactionID uint64
	// TransactionsSince counts the transaction ids assigned after it (PostgreSQL's age(xid)):
	// how far the cluster moved on meanwhile.
	TransactionsSince int64
	// HeldEvents counts the committed events that wait behind it, up to HeldEventsLimit
	// (HeldEventsMore is then set).
	HeldEvents     int64
	HeldEventsMore bool

	// Hidden says why some fields below are unknown, "" when all are known: the server shows
	// another user's transaction start, state, wait and client only to members of
	// pg_read_all_stats (or superusers), and a transaction may end while it is looked up.
	Hidden string

	// PID is the holding session's backend process id; 0 for a prepared transaction.
	PID int
	// Database, User, ApplicationName and ClientAddr describe the session.
	Database        string
	User            string
	ApplicationName string
	ClientAddr      string
	// Started is when the transaction began; Age is how long it has been open.
	Started time.Time
	Age     time.Duration
	// State is the session's state ("active", "idle in transaction", …) and WaitEvent what it
	// waits for ("Lock:transactionid", "Client:ClientRead", …), "" when it waits for nothing.
	State     string
	WaitEvent string
	// PreparedGID names the transaction when it is a prepared (two-phase) transaction: it
	// outlives any session until COMMIT PREPARED or ROLLBACK PREPARED.
	PreparedGID string
	// WritesEvents reports whether the transaction has written to the store's events table;
	// known only for a session of the store's own database (WritesEventsKnown).
	WritesEvents      bool
	WritesEventsKnown bool
}

// HeldEventsLimit bounds how many held events a holder report counts.
const HeldEventsLimit = 100_000

// Short names the holder in a few words, for a table: its session and age.
func (h *HorizonHolder) Short() string {
	if h == nil {
		return "nothing"
	}
	var b strings.Builder
	switch {
	case h.PreparedGID != "":
		fmt.Fprintf(&b, "prepared transaction %q", h.PreparedGID)
	case h.PID != 0:
		fmt.Fprintf(&b, "pid %d (%s)", h.PID, h.Database)
	default:
		fmt.Fprintf(&b, "transaction %d", h.TransactionID)
	}
	if h.Age > 0 {
		fmt.Fprintf(&b, ", open %s", h.Age.Round(time.Millisecond))
	}
	return b.String()
}

// String describes the holder on one line, for logs and terminals.
func (h *HorizonHolder) String() string {
	if h == nil {
		return "nothing holds the horizon"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "transaction %d", h.TransactionID)
	switch {
	case h.PreparedGID != "":
		fmt.Fprintf(&b, " (prepared %q, database %s, owner %s)", h.PreparedGID, h.Database, h.User)
	case h.PID != 0:
		fmt.Fprintf(&b, " (pid %d, database %s, user %s", h.PID, h.Database, h.User)
		if h.ApplicationName != "" {
			fmt.Fprintf(&b, ", application %q", h.ApplicationName)
		}
		if h.ClientAddr != "" {
			fmt.Fprintf(&b, ", client %s", h.ClientAddr)
		}
		if h.State != "" {
			fmt.Fprintf(&b, ", %s", h.State)
		}
		if h.Hidden != "" {
			fmt.Fprintf(&b, "; %s", h.Hidden)
		}
		if h.WaitEvent != "" {
			fmt.Fprintf(&b, ", waiting on %s", h.WaitEvent)
		}
		b.WriteString(")")
	default:
		fmt.Fprintf(&b, " (%s)", h.Hidden)
	}
	if h.Age > 0 {
		fmt.Fprintf(&b, ", open %s", h.Age.Round(time.Millisecond))
	}
	if h.WritesEventsKnown {
		if h.WritesEvents {
			b.WriteString(", has written events")
		} else {
			b.WriteString(", has written no events")
		}
	}
	more := ""
	if h.HeldEventsMore {
		more = "+"
	}
	fmt.Fprintf(&b, ", holds back %d%s committed events", h.HeldEvents, more)
	return b.String()
}
