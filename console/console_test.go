package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// TestNewRefusesConfig: a Config New cannot use is refused with ErrInvalidConfig.
func TestNewRefusesConfig(t *testing.T) {
	t.Parallel()
	_, err := console.New(console.Config{})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	db := pgtest.New(t)
	pool := db.NewPool(t, 2)
	_, err = console.New(console.Config{DB: pool, Writes: true})
	require.ErrorIs(t, err, console.ErrInvalidConfig, "writes without a channel")
	_, err = console.New(console.Config{DB: pool, BasePath: "console"})
	require.ErrorIs(t, err, console.ErrInvalidConfig, "a base path without /")
}

// nopChannel publishes nothing.
type nopChannel struct{}

func (nopChannel) Publish(_ context.Context, _ trigger.Trigger) error { return nil }

// TestWritesRefused: a read-only console refuses every POST with 405 and shows no forms; a
// console with writes refuses a POST without the CSRF token (or with another browser's) with
// 403, and takes one with it.
func TestWritesRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t, 4)
	require.NoError(t, postgres.Migrate(t.Context(), pool, ""))
	ro, err := console.New(console.Config{DB: pool, Logger: testlog.New(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(ro)
	t.Cleanup(srv.Close)
	resp, err := http.PostForm(srv.URL+"/actions/replay", url.Values{"projection": {"tickets"}})
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "read-only")

	rw, err := console.New(console.Config{DB: pool, Channel: nopChannel{}, Writes: true, BasePath: "/console", Logger: testlog.New(t)})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/console/", rw)
	srv = httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(cookie *http.Cookie, token string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/console/actions/replay",
			strings.NewReader(url.Values{"projection": {"tickets"}, "csrf": {token}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(nil, ""), "no cookie, no token")

	// A page gives the browser its cookie and the forms their token.
	cookie, token := formToken(t, srv.URL+"/console/projections/tickets")
	require.Equal(t, http.StatusForbidden, post(cookie, ""), "no token")
	require.Equal(t, http.StatusForbidden, post(cookie, token+"x"), "a wrong token")
	other, _ := formToken(t, srv.URL+"/console/projections/tickets")
	require.Equal(t, http.StatusForbidden, post(other, token), "another browser's token")
	require.Equal(t, http.StatusSeeOther, post(cookie, token), "the token taken")

	// A skip needs the event's id typed back.
	skip := func(confirm string) int {
		form := url.Values{"projection": {"tickets"}, "event": {"0196a1c2-7b1e-7d3a-9a1b-0c1d2e3f4a5b"}, "confirm": {confirm},
			"reason": {"bad import"}, "csrf": {token}}
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/console/actions/skip", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(cookie)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, http.StatusBadRequest, skip(""), "no confirmation")
	require.Equal(t, http.StatusBadRequest, skip("0196a1c2"), "a wrong confirmation")
}

// formToken GETs a page and returns the CSRF cookie it set and its forms' token.
func formToken(t *testing.T, page string) (*http.Cookie, string) {
	t.Helper()
	resp, err := http.Get(page)
	require.NoError(t, err)
	defer resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "nudge_console_csrf" {
			cookie = c
		}
	}
	require.NotNil(t, cookie, "the page sets the CSRF cookie")
	var body strings.Builder
	_, err = io.Copy(&body, resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`name="csrf" content="([^"]+)"`).FindStringSubmatch(body.String())
	if m == nil {
		return cookie, ""
	}
	return cookie, m[1]
}

// TestOutcomeSigned: the outcome an action's redirect shows is signed by the console (the
// resolve in TestDeadLetterResolve shows its own); a link with an outcome of its own making
// shows none.
func TestOutcomeSigned(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t, 4)
	require.NoError(t, postgres.Migrate(t.Context(), pool, ""))
	h, err := console.New(console.Config{DB: pool, Channel: nopChannel{}, Writes: true, Logger: testlog.New(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, link := range []string{"/deadletters/1?done=", "/projections/tickets?done=", "/deadletters/1?sig=AAAA&done="} {
		resp, err := http.Get(srv.URL + link + url.QueryEscape("resolved dead letter 1 (by ann)"))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.NotContains(t, string(body), "by ann", "%s: an outcome the console did not sign", link)
	}
}
