package eventstore

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
)

// Position is an event's place in the global read order.
//
// Global positions are handed out when an event is inserted, but transactions commit in another
// order, so a reader that asks for "everything after global position P" can miss an event whose
// transaction commits late. The PostgreSQL store therefore orders events by the transaction that
// wrote them first and by global position second, and only reads transactions that can no longer
// be joined by anything in flight. A Position is that pair. Compare positions with Compare or
// Less, never by GlobalPosition alone.
//
// The zero Position lies before every event: reading after it starts at the beginning.
type Position struct {
	// TransactionID is the PostgreSQL transaction id (xid8) that wrote the event; stores
	// without transactions use an increasing commit number.
	TransactionID uint64
	// GlobalPosition is the event's insertion sequence number, unique across all streams.
	GlobalPosition int64
}

// Compare returns -1 if p is before q in read order, +1 if it is after and 0 if they are equal.
func (p Position) Compare(q Position) int {
	if c := cmp.Compare(p.TransactionID, q.TransactionID); c != 0 {
		return c
	}
	return cmp.Compare(p.GlobalPosition, q.GlobalPosition)
}

// Less reports whether p is before q in read order.
func (p Position) Less(q Position) bool { return p.Compare(q) < 0 }

// IsZero reports whether p is the start position.
func (p Position) IsZero() bool { return p == Position{} }

// String formats p as "transaction_id/global_position", e.g. "7414/1203"; ParsePosition reads it.
func (p Position) String() string {
	return strconv.FormatUint(p.TransactionID, 10) + "/" + strconv.FormatInt(p.GlobalPosition, 10)
}

// ParsePosition parses the form written by Position.String.
func ParsePosition(s string) (Position, error) {
	invalid := &ValidationError{Field: "Position", Index: -1,
		Reason: fmt.Sprintf("%q: want two non-negative integers transaction_id/global_position, e.g. 7414/1203", s)}
	tx, gp, ok := strings.Cut(s, "/")
	if !ok {
		return Position{}, invalid
	}
	txID, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		return Position{}, invalid
	}
	global, err := strconv.ParseInt(gp, 10, 64)
	if err != nil || global < 0 {
		return Position{}, invalid
	}
	return Position{TransactionID: txID, GlobalPosition: global}, nil
}
