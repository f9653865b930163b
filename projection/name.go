package projection

import (
	"fmt"
	"regexp"

	"github.com/nudgeworks/nudge/internal/reserved"
)

// MaxNameLength is the longest projection name accepted, in bytes. Names become parts of queue
// and table names, and PostgreSQL identifiers hold 63 bytes.
const MaxNameLength = 63

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// ValidateName checks a projection name: 1 to 63 bytes of lowercase letters, digits, '_', '-'
// and '.', starting with a letter or digit. Anything else (spaces, quotes, uppercase, SQL or
// AMQP metacharacters) is refused with a *NameError, before it can reach SQL or a broker.
func ValidateName(name string) error {
	switch {
	case name == "":
		return &NameError{Name: name, Reason: "empty"}
	case len(name) > MaxNameLength:
		return &NameError{Name: name, Reason: fmt.Sprintf("%d bytes long; at most %d allowed", len(name), MaxNameLength)}
	case !namePattern.MatchString(name):
		return &NameError{Name: name, Reason: "use lowercase letters, digits, '_', '-' and '.', starting with a letter or digit"}
	}
	return nil
}

// ReservedPrefix starts the names of nudge's own projections, such as the trigger relay's
// (trigger.RelayNameDefault, "nudge-relay"): New refuses such a name, so no projection of yours
// can take a relay's position and status row. ValidateName accepts it, so such projections
// can still be looked up by name (their status, say).
const ReservedPrefix = "nudge-"

func init() {
	reserved.NewProjection = newProjection
}
