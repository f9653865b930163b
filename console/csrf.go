package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrfCookie holds a browser's random CSRF value; a form's token is its HMAC under the
// handler's secret (double submit, signed), so a page elsewhere can neither read nor forge it.
const csrfCookie = "nudge_console_csrf"

// csrfToken returns the token for r's forms, setting the cookie when r has none.
func (c *console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if !c.cfg.Writes {
		return ""
	}
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 32 {
		return c.sign(ck.Value)
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	v := base64.RawURLEncoding.EncodeToString(raw)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: cookiePath(c.basePath), HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return c.sign(v)
}

// csrfValid reports whether r carries its cookie's token in the form field csrf.
func (c *console) csrfValid(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) < 32 {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(c.sign(ck.Value)))
}

func (c *console) sign(v string) string { return c.mac("csrf", v) }

// mac is v's HMAC under the handler's secret, for purpose, in base64.
func (c *console) mac(purpose, v string) string {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write([]byte("nudge console " + purpose + "\x00" + v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// outcome is the outcome of the action that redirected r here, signed by this handler (so a
// link made elsewhere cannot put words in the console's mouth); "" when none.
func (c *console) outcome(r *http.Request) string {
	q := r.URL.Query()
	done := q.Get("done")
	if done == "" || !hmac.Equal([]byte(q.Get("sig")), []byte(c.mac("outcome", done))) {
		return ""
	}
	return done
}

func cookiePath(base string) string {
	if base == "" {
		return "/"
	}
	return base + "/"
}
