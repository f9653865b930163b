package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// terminalSafe is s made safe to print on a terminal: control characters (C0 such as ESC and
// CR, DEL, C1) are written the way Go quotes them (\x1b, \r, \u009b) and each byte of invalid
// UTF-8 as \xNN, so that text from events, errors or the database cannot move the cursor,
// recolour the screen or overwrite what was printed. Other text, backslashes included, is
// unchanged, and safe text stays as it is (terminalSafe(terminalSafe(s)) == terminalSafe(s)).
//
// Every text field of a command's text output that comes from an event, an error or the
// database goes through it; --json output needs not, as encoding/json escapes controls.
func terminalSafe(s string) string {
	i := strings.IndexFunc(s, unsafeRune)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for s = s[i:]; s != ""; {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[0])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[0])&0xf, 16))
		case unicode.IsControl(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

// unsafeRune reports a rune terminalSafe escapes: a control character or invalid UTF-8, which
// strings.IndexFunc sees as utf8.RuneError.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || r == utf8.RuneError
}

// terminalSafeLines is terminalSafe for a message of several lines (an error that ends with
// advice on a line of its own): it keeps the line breaks and escapes everything else. Text
// from the database inside such a message goes through terminalSafe first, so that a line
// break of its own cannot pass for one of ours.
func terminalSafeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = terminalSafe(l)
	}
	return strings.Join(lines, "\n")
}
