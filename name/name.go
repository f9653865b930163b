// Package name checks the names of projections (and of nudge's own, such as the relay's)
// before they reach SQL or a broker: a projection's name becomes part of queue, subscription
// and table names. It is a leaf: channels, dead-letter stores and the CLI check names with it
// without importing the projection runner.
package name

import (
	"errors"
	"fmt"
	"regexp"
)

// MaxLength is the longest name accepted, in bytes. Names become parts of queue and table
// names, and PostgreSQL identifiers hold 63 bytes.
const MaxLength = 63

// ReservedPrefix starts the names of nudge's own projections, such as the relay's
// ("nudge-relay"): projection.New refuses such a name, so no projection of yours can take a
// relay's position and status row. Validate accepts it, so such projections can still be looked
// up by name (their status, say).
const ReservedPrefix = "nudge-"

// ErrInvalid matches every name that cannot be used; the concrete error is an *Error.
var ErrInvalid = errors.New("projection: invalid name")

// Error is an invalid name and why. It matches ErrInvalid.
type Error struct {
	Name   string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("projection: invalid name %q: %s", e.Name, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

var pattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// Validate checks a projection name: 1 to MaxLength (63) bytes of lowercase letters, digits,
// '_', '-' and '.', starting with a letter or digit. Anything else (spaces, quotes, uppercase,
// SQL or AMQP metacharacters) is refused with an *Error, before it can reach SQL or a broker.
func Validate(s string) error {
	switch {
	case s == "":
		return &Error{Name: s, Reason: "empty"}
	case len(s) > MaxLength:
		return &Error{Name: s, Reason: fmt.Sprintf("%d bytes long; at most %d allowed", len(s), MaxLength)}
	case !pattern.MatchString(s):
		return &Error{Name: s, Reason: "use lowercase letters, digits, '_', '-' and '.', starting with a letter or digit"}
	}
	return nil
}
