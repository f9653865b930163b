package console

import (
	"cmp"
	"html/template"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/lease"
)

// funcs are the templates' functions.
var funcs = template.FuncMap{
	"visible":  visible,
	"lines":    visibleLines,
	"short":    short,
	"duration": duration,
	"owner":    owner,
	"rate":     rate,
}

// shortWidth is how many characters of an error a table shows.
const shortWidth = 120

// short is s cut to shortWidth characters, on one line.
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= shortWidth {
		return s
	}
	return string([]rune(s)[:shortWidth-1]) + "…"
}

// duration is d the short way operators read it: "0s", "340ms", "42s", "3m4s", "2h5m0s".
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// visible is s with every control character and invalid byte written out (\x1b, \n, \u202e),
// so terminal escapes and hidden text show as what they are. html/template escapes the rest.
func visible(s string) string {
	i := strings.IndexFunc(s, hidden)
	if i < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for s != "" {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[0])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[0])&0xf, 16))
		case hidden(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

// visibleLines is visible for each line of s, keeping the line breaks.
func visibleLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = visible(l)
	}
	return strings.Join(lines, "\n")
}

// hidden reports a rune that does not show as itself: control and bidirectional formatting
// characters.
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// table is name in schema, quoted for SQL.
func table(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// owner is the owner of partition i in leases: the worker's id, "unowned", or "" when unknown.
func owner(leases []lease.Lease, i int) string {
	for _, l := range leases {
		if l.Partition == i {
			return cmp.Or(l.Owner, "unowned")
		}
	}
	return ""
}
