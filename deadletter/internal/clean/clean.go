// Package clean makes text and times the way dead-letter stores keep them. Package deadletter
// (Replay) and the stores' shared rules (deadletter/internal/dlstore) both use it.
package clean

import (
	"fmt"
	"strings"
	"time"
)

// Text returns s as valid UTF-8 without NUL bytes, which PostgreSQL text and jsonb cannot hold:
// NULs are dropped and invalid bytes become U+FFFD. Dead letters carry text off the wire, and a
// write that fails on it would bring the trigger back forever.
func Text(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// Time returns t as stores keep it: in UTC, cut to microseconds (PostgreSQL's precision),
// without a monotonic clock reading. The zero time stays zero.
func Time(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}

// Actor checks the name of who replays or resolves (field names the argument in the error) and
// returns it cleaned. Callers wrap the error in their package's invalid-input sentinel.
func Actor(field, by string) (string, error) {
	by = strings.TrimSpace(Text(by))
	if by == "" {
		return "", fmt.Errorf("%s is empty: say who acts, e.g. an operator's name or \"worker-start\"; it is kept on the record", field)
	}
	return by, nil
}
