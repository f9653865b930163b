// Package redact keeps passwords of connection strings out of messages, logs and output.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces a password.
const Mask = "xxxxx"

// URL returns raw with its password replaced by Mask, for messages and logs.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Message replaces the password of the connection string raw — a URL, or PostgreSQL's
// key=value form — wherever it appears in msg (a driver may quote it), escaped or not. When raw
// cannot be parsed, msg is withheld: it may hold the whole string.
func Message(msg, raw string) string {
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, Mask)
			if esc := url.QueryEscape(pw); esc != pw {
				msg = strings.ReplaceAll(msg, esc, Mask)
			}
		}
		return msg
	}
	if err == nil && u.Scheme != "" {
		return msg // a URL without a password
	}
	keyValue := false
	for _, field := range strings.Fields(raw) {
		k, v, ok := strings.Cut(field, "=")
		keyValue = keyValue || ok
		if ok && k == "password" && strings.Trim(v, "'") != "" {
			msg = strings.ReplaceAll(msg, strings.Trim(v, "'"), Mask)
		}
	}
	if err != nil && !keyValue {
		return "(message withheld: it may hold the unparsable connection string)"
	}
	return msg
}

// Args returns args with the passwords of the URLs among them (alone or as key=URL) masked.
func Args(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if k, v, ok := strings.Cut(a, "="); ok && strings.Contains(v, "://") {
			out[i] = k + "=" + URL(v)
		} else if strings.Contains(a, "://") {
			out[i] = URL(a)
		}
	}
	return out
}
