// Package namecheck holds the rule for the names an event store keeps (stream ids, event
// types), so the eventstore package and the checks every store backend applies
// (internal/storecheck) refuse the same names with the same words.
package namecheck

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Problem says what is wrong with the name s, which may hold at most maxLen bytes, or returns ""
// when s is fine: s must name something (not only white space), be valid UTF-8 and hold no NUL
// byte, which PostgreSQL text cannot store.
func Problem(s string, maxLen int) string {
	switch {
	case strings.TrimSpace(s) == "":
		return "empty; it must name something"
	case len(s) > maxLen:
		return fmt.Sprintf("%d bytes long; at most %d allowed", len(s), maxLen)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.ContainsRune(s, 0):
		return "contains a NUL byte"
	}
	return ""
}
