package projection

import (
	"fmt"
	"strings"

	"github.com/nudgeworks/nudge/internal/reserved"
	"github.com/nudgeworks/nudge/name"
)

// refuseReserved refuses a name starting with name.ReservedPrefix: such names are nudge's own
// (the relay's), so no projection of a user's can share their position and status row.
func refuseReserved(s string) error {
	if strings.HasPrefix(s, name.ReservedPrefix) {
		return &name.Error{Name: s, Reason: fmt.Sprintf("names starting with %q are kept for nudge's own projections, such as the relay's (nudge-relay); choose another name", name.ReservedPrefix)}
	}
	return nil
}

func init() {
	reserved.NewProjection = newProjection
}

// validateName is name.Validate, for functions whose parameter called name hides the package.
func validateName(s string) error { return name.Validate(s) }
