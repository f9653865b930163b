package deadletter

import "fmt"

// Status is where a dead letter stands. It is stored as text.
type Status string

const (
	// StatusFailed: the trigger ran out of retries (or could never succeed) and waits for an
	// operator. A later failure of a replayed record sets it back to failed.
	StatusFailed Status = "failed"
	// StatusReplayed: a trigger was published again to the record's projection (Replay). If the
	// projection fails again on the same event, the record returns to failed.
	StatusReplayed Status = "replayed"
	// StatusResolved: an operator closed the record (Resolve). A resolved record never changes
	// again except by Purge; a new failure for the same event starts a new record.
	StatusResolved Status = "resolved"
)

// Statuses lists every status.
func Statuses() []Status {
	return []Status{StatusFailed, StatusReplayed, StatusResolved}
}

// ParseStatus returns the Status named s, or an error matching ErrUnknownStatus.
func ParseStatus(s string) (Status, error) {
	for _, st := range Statuses() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: %q; known statuses: %v", ErrUnknownStatus, s, Statuses())
}

// Replayable reports whether Replay and Store.MarkReplayed act on a record in status st
// (failed or replayed).
func (st Status) Replayable() bool { return st == StatusFailed || st == StatusReplayed }
