package redact

import (
	"regexp"
	"strings"
)

// dsnStart is the start of a key=value connection string: a keyword and '='.
var dsnStart = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// isDSN reports whether raw is in PostgreSQL's key=value form rather than a URL.
func isDSN(raw string) bool {
	return dsnStart.MatchString(raw) && !strings.Contains(raw, "://")
}

// dsnPassword is a password value of a key=value string.
type dsnPassword struct {
	// start and end delimit the value as written, quotes included.
	start, end int
	// value is the value with quotes and backslash escapes resolved.
	value string
	// unterminated is true for a quoted value without its closing quote: it runs to the end.
	unterminated bool
}

// passwordKey finds the password keywords of a key=value string and the '=' after them.
var passwordKey = regexp.MustCompile(`(?i)(?:^|\s)(?:ssl)?password\s*=\s*`)

// dsnPasswords finds every password value in raw, read as libpq reads values (bare up to white
// space, or in single quotes, with \' and \\ escapes). It looks for the keyword anywhere a word
// starts, even where libpq would see it inside another value (a malformed string), so it may
// find more than libpq, never less.
func dsnPasswords(raw string) []dsnPassword {
	var out []dsnPassword
	next := 0
	for _, m := range passwordKey.FindAllStringIndex(raw, -1) {
		if m[1] < next {
			continue
		}
		v := dsnPassword{start: m[1]}
		v.value, v.unterminated, v.end = dsnValueAt(raw, m[1])
		if v.end > v.start {
			out = append(out, v)
			next = v.end
		}
	}
	return out
}

// dsnValueAt reads the value that starts at raw[i] and returns it, whether it is an
// unterminated quote, and the index after it.
func dsnValueAt(raw string, i int) (string, bool, int) {
	var b strings.Builder
	quoted := i < len(raw) && raw[i] == '\''
	if quoted {
		i++
	}
	for i < len(raw) {
		c := raw[i]
		switch {
		case c == '\\' && i+1 < len(raw):
			b.WriteByte(raw[i+1])
			i += 2
			continue
		case quoted && c == '\'':
			return b.String(), false, i + 1
		case !quoted && isSpace(c):
			return b.String(), false, i
		}
		b.WriteByte(c)
		i++
	}
	return b.String(), quoted, i
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// maskPasswordValues returns s with every password value of key=value text, quotes included,
// replaced by Mask, and the texts a message may show them as.
func maskPasswordValues(s string) (string, []string) {
	var (
		b     strings.Builder
		spans []string
		last  int
	)
	for _, v := range dsnPasswords(s) {
		if s[v.start:v.end] == Mask {
			continue
		}
		b.WriteString(s[last:v.start])
		b.WriteString(Mask)
		spans = append(spans, s[v.start:v.end], strings.Trim(s[v.start:v.end], "'"), v.value)
		if v.unterminated {
			// A driver that echoes the string may have cut it anywhere.
			spans = append(spans, strings.Fields(v.value)...)
		}
		last = v.end
	}
	b.WriteString(s[last:])
	return b.String(), spans
}

// maskDSN returns raw with every password value, quotes included, replaced by Mask, and the
// texts a message may show the passwords as; complete is false when they are too many to list
// (see spanPieces). A value that holds user information (a URL in a value, or a string that
// only looks like key=value) is masked as in a URL.
func maskDSN(raw string) (masked string, spans []string, complete bool) {
	complete = true
	masked, spans = maskPasswordValues(raw)
	if strings.ContainsRune(masked, '@') {
		words, changed := strings.Fields(masked), false
		for i, w := range words {
			if m, span, ok := maskUserinfo(w); ok {
				words[i], changed = m, true
				pieces, few := spanPieces(span)
				if !few {
					pieces = []string{span}
					complete = false
				}
				spans = append(spans, pieces...)
			}
		}
		if changed {
			masked = strings.Join(words, " ")
		}
	}
	return printable(masked), spans, complete
}
