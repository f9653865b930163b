// Package redact keeps passwords of connection strings out of messages, logs and output.
//
// A connection string is a URL (amqp://user:password@host/vhost, postgres://…), or
// PostgreSQL's key=value form (host=h password='a b'). Well-formed URLs keep their shape, with
// the password replaced by Mask. A string that is not a well-formed URL — a slash or colon
// missing after the scheme (amqp//user:password@host, amqp:/user:password@host), no scheme
// at all (user:password@host:5672), an unencoded '#', '/' or '@' in the password — is not
// trusted to url.Parse, which reads such text as a path or an opaque part and would print the
// password: any text between the first ':' of what could be user information and the last
// '@' is masked, more than the password rather than less.
package redact

import (
	"cmp"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Mask replaces a password.
const Mask = "xxxxx"

// URL returns raw, a connection string, with its passwords replaced by Mask, for messages and
// logs.
func URL(raw string) string {
	if isDSN(raw) {
		masked, _, _ := maskDSN(raw)
		return masked
	}
	if u, ok := wellFormed(raw); ok {
		u.RawQuery = passwordParam.ReplaceAllString(u.RawQuery, "${1}"+Mask)
		return u.Redacted()
	}
	masked, _ := maskMalformed(raw)
	return printable(masked)
}

// Message replaces the passwords of the connection string raw wherever they appear in msg (a
// driver may quote them), escaped or not. When raw is not a URL nor a key=value string and
// holds nothing like user information, msg is withheld: it may hold the whole string.
func Message(msg, raw string) string {
	secrets, known := secretsOf(raw)
	if !known {
		return "(message withheld: it may hold the unparsable connection string)"
	}
	return maskAll(msg, secrets)
}

// maskAll replaces every occurrence of every secret in msg by Mask. Occurrences that overlap
// (a password inside a longer masked span, say) are masked as one, so none is left half shown.
func maskAll(msg string, secrets []string) string {
	covered := make([]bool, len(msg))
	found := false
	for _, s := range secrets {
		for from := 0; ; {
			i := strings.Index(msg[from:], s)
			if i < 0 {
				break
			}
			for j := from + i; j < from+i+len(s); j++ {
				covered[j] = true
			}
			found = true
			from += i + 1
		}
	}
	if !found {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if !covered[i] {
			b.WriteByte(msg[i])
			continue
		}
		b.WriteString(Mask)
		for i+1 < len(msg) && covered[i+1] {
			i++
		}
	}
	return b.String()
}

// Args returns args with the passwords of the connection strings among them (alone, or as
// key=value such as --db=…) masked.
func Args(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = arg(a)
	}
	return out
}

func arg(a string) string {
	if !sensitive(a) {
		return a
	}
	if isDSN(a) {
		return URL(a)
	}
	if k, v, ok := strings.Cut(a, "="); ok && !strings.ContainsAny(k, ":/@") && sensitive(v) {
		return k + "=" + URL(v)
	}
	return URL(a)
}

// sensitive reports whether s may hold a password: it holds a URL, user information or a
// password parameter.
func sensitive(s string) bool {
	return strings.Contains(s, "://") || strings.Contains(s, "@") || passwordParam.MatchString(s)
}

// passwordParam matches a password parameter of a URL's query (or of a key=value fragment):
// group 1 is the text before the value, group 2 the value.
var passwordParam = regexp.MustCompile(`(?i)((?:^|[^a-z0-9_])(?:ssl)?password=)([^&#\s]*)`)

// wellFormed parses raw as a URL that url.Parse reads as the user meant: a scheme, a host, no
// white space, and no '@' anywhere but in the user information (one in a path, a query or a
// fragment means a password with an unencoded '/', '?' or '#' was cut short), nor a password
// parameter in the fragment.
func wellFormed(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" || u.Host == "" || strings.ContainsFunc(raw, unicode.IsSpace) ||
		strings.Contains(strings.ToLower(u.Fragment), "password") {
		return nil, false
	}
	if strings.Contains(u.Host, "@") || strings.Contains(u.EscapedPath(), "@") || strings.Contains(u.RawQuery, "@") ||
		strings.Contains(u.EscapedFragment(), "@") || strings.Contains(u.Path, "@") || strings.Contains(u.Fragment, "@") {
		return nil, false
	}
	return u, true
}

// secretsOf returns the texts of raw that must not appear in a message, longest first, and
// whether raw was understood (a URL, a key=value string, or text with user information).
func secretsOf(raw string) ([]string, bool) {
	secrets, known, ok := passwordsOf(raw)
	if !ok {
		return nil, false
	}
	secrets = append(secrets, paramPasswords(raw)...)
	secrets = withEncodings(secrets)
	secrets = slices.DeleteFunc(secrets, func(s string) bool { return s == "" || s == Mask })
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return slices.Compact(secrets), known
}

// paramPasswords returns the values of raw's password parameters (password=… in a URL's query
// or anywhere in the text), but not the values of a key=value string that dsnPasswords read
// whole: this pattern stops a quoted value at its first space ('po of 'po secret'), and such a
// piece would mask the same text elsewhere in a message.
func paramPasswords(raw string) []string {
	var whole map[int]bool
	if isDSN(raw) {
		whole = make(map[int]bool)
		for _, v := range dsnPasswords(raw) {
			whole[v.start] = true
		}
	}
	var out []string
	for _, m := range passwordParam.FindAllStringSubmatchIndex(raw, -1) {
		if !whole[m[4]] {
			out = append(out, raw[m[4]:m[5]])
		}
	}
	return out
}

// passwordsOf returns the passwords of raw's key=value pairs or user information, each with
// the pieces a driver may cut it into, and whether raw was understood (known). ok is false when
// a password can be cut in too many ways: then the message must be withheld.
func passwordsOf(raw string) (secrets []string, known, ok bool) {
	switch u, isURL := wellFormed(raw); {
	case isDSN(raw):
		_, secrets, complete := maskDSN(raw)
		return secrets, true, complete
	case isURL:
		if _, set := u.User.Password(); !set {
			return nil, true, true
		}
		// A password with an unencoded '@' or ':' may be cut there by a driver, or have
		// been meant to end there.
		pieces, ok := spanPieces(rawPassword(raw))
		return pieces, true, ok
	default:
		_, spans := maskMalformed(raw)
		for _, s := range spans {
			pieces, ok := spanPieces(s)
			if !ok {
				return nil, false, false // too many ways to cut it
			}
			secrets = append(secrets, pieces...)
		}
		_, err := url.Parse(raw)
		return secrets, err == nil || len(spans) > 0, true
	}
}

// withEncodings adds to secrets the forms a driver may show them in: decoded, or encoded again.
func withEncodings(secrets []string) []string {
	for _, s := range slices.Clone(secrets) {
		if plain, err := url.PathUnescape(s); err == nil && plain != s {
			secrets = append(secrets, plain)
		}
	}
	for _, s := range slices.Clone(secrets) {
		secrets = append(secrets, url.QueryEscape(s), url.PathEscape(s))
	}
	return secrets
}

// rawPassword is the password of a well-formed URL as written in raw (percent-encoded or not).
func rawPassword(raw string) string {
	_, rest, _ := strings.Cut(raw, "//")
	if end := strings.IndexAny(rest, "/?#"); end >= 0 {
		rest = rest[:end]
	}
	userinfo, _, ok := cutLast(rest, "@")
	if !ok {
		return ""
	}
	_, pw, _ := strings.Cut(userinfo, ":")
	return pw
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// printable escapes the runes of s that a terminal would not show as themselves (control
// characters, invalid UTF-8), as Go does in a quoted string.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsGraphic(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}
