package redact

import (
	"regexp"
	"strings"
)

// spanPieces returns the texts a masked span of a malformed string may hold the password as:
// the span cut after any of its ':' (the user's own colons come first) and before any of its
// '@' (the host's and the path's come after), and whether they are few enough to try.
func spanPieces(span string) ([]string, bool) {
	starts, ends := []int{0}, []int{len(span)}
	for i := range len(span) {
		switch span[i] {
		case ':':
			starts = append(starts, i+1)
		case '@':
			ends = append(ends, i)
		}
	}
	const maxPieces = 64
	if len(starts)*len(ends) > maxPieces {
		return nil, false
	}
	var pieces []string
	for _, from := range starts {
		for _, to := range ends {
			if from < to {
				pieces = append(pieces, span[from:to])
			}
		}
	}
	return pieces, true
}

// schemePrefix is a scheme and the slashes after it, as far as they can be told apart from
// user information: "amqp://", "amqp:/", "amqp//", but not "guest:" in guest:secret@host.
var schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*(?::/+|/+)`)

// maskMalformed masks what could be the password in raw, a string that is not a well-formed
// URL, and returns the masked text and the texts of raw a message may show the passwords as.
// Password values of key=value text (password='a b') and of a query (?password=…) are masked;
// then, with an '@', the text after the first ':' (past a scheme and its slashes) up to the
// last '@'; without, the text after a host's ':' that is not a port number (guest:secret, the
// host forgotten).
func maskMalformed(raw string) (string, []string) {
	masked, spans := maskPasswordValues(raw)
	if m := passwordParam.FindAllStringSubmatch(masked, -1); m != nil {
		for _, sm := range m {
			if sm[2] != "" && sm[2] != Mask {
				spans = append(spans, sm[2])
			}
		}
		masked = passwordParam.ReplaceAllString(masked, "${1}"+Mask)
	}
	// A message may echo raw or the text masked so far: the spans of both count.
	if _, span := maskAfterColon(raw); span != "" {
		spans = append(spans, span)
	}
	masked, span := maskAfterColon(masked)
	if span != "" && span != Mask {
		spans = append(spans, span)
	}
	return masked, spans
}

// maskAfterColon masks the user information of s, or else a host's ':' and what follows when
// it is not a port; span is what it masked.
func maskAfterColon(s string) (masked, span string) {
	if m, span, ok := maskUserinfo(s); ok {
		return m, span
	}
	start := len(schemePrefix.FindString(s))
	if colon := hostColon(s[start:]); colon >= 0 && !strings.Contains(s[start:], "@") {
		colon += start
		if port := s[colon+1:]; !isPort(port) {
			return s[:colon+1] + Mask, port
		}
	}
	return s, ""
}

// maskUserinfo masks the text of s after the first ':' of what could be user information
// (past a scheme and its slashes) up to the last '@', and returns the masked text; ok is false
// when s has no such text.
func maskUserinfo(s string) (masked, span string, ok bool) {
	start := len(schemePrefix.FindString(s))
	at := strings.LastIndexByte(s, '@')
	if at < start {
		return s, "", false
	}
	colon := strings.IndexByte(s[start:at], ':')
	if colon >= 0 {
		colon += start
	} else {
		colon = strings.IndexByte(s[:at], ':') // the "scheme" was a user: guest:/secret@host
	}
	if colon < 0 || colon+1 >= at {
		return s, "", false
	}
	return s[:colon+1] + Mask + s[at:], s[colon+1 : at], true
}

// hostColon is the index of the ':' after the host at the start of s, or -1; an IPv6 host's
// colons in brackets do not count.
func hostColon(s string) int {
	skip := 0
	if strings.HasPrefix(s, "[") {
		if end := strings.IndexByte(s, ']'); end >= 0 {
			skip = end
		}
	}
	if i := strings.IndexByte(s[skip:], ':'); i >= 0 {
		return skip + i
	}
	return -1
}

// isPort reports whether s, the text after a host's ':', is a port number up to the path,
// query or fragment (or nothing).
func isPort(s string) bool {
	if end := strings.IndexAny(s, "/?#"); end >= 0 {
		s = s[:end]
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
