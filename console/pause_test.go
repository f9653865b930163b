package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

// recordingChannel keeps the triggers the console publishes.
type recordingChannel struct {
	mu   sync.Mutex
	sent []trigger.Trigger
}

func (c *recordingChannel) Publish(_ context.Context, t trigger.Trigger) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, t)
	return nil
}

func (c *recordingChannel) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

// TestPauseResume: Pause on a projection's page pauses it — every partition of a partitioned
// one — by name, with no definition at hand, and the page then offers Resume; pausing again
// changes nothing and says so; Resume sets it running and publishes a catch-up trigger, so it
// reads on at once.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()
	_, backend := newBackend(ctx, t, pool)
	p, err := projection.New("orders", projection.Config{Partitions: 4},
		projection.OnIdempotent("X", func(context.Context, projection.Event[struct{}]) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, backend.Register(ctx, p, nil))

	ch := &recordingChannel{}
	h, err := console.New(console.Config{DB: pool, Channel: ch, Writes: true, Logger: testlog.New(t), ActorHeader: "X-User"})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	cookie, token := formToken(t, srv.URL+"/projections/orders")
	act := func(action string) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/actions/"+action,
			strings.NewReader(url.Values{"projection": {"orders"}, "csrf": {token}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-User", "<b>ann</b>")
		req.AddCookie(cookie)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, action)
		done, err := url.Parse(resp.Header.Get("Location"))
		require.NoError(t, err)
		return done.Query().Get("done")
	}
	states := func() []projection.State {
		st, err := backend.StatusOf(ctx, "orders")
		require.NoError(t, err)
		var out []projection.State
		for _, part := range st.Partitions {
			out = append(out, part.State)
		}
		return out
	}
	require.Contains(t, get(t, srv.URL+"/projections/orders"), `id="pause"`)

	require.NotContains(t, get(t, srv.URL+"/projections/orders"), "paused by")

	require.Contains(t, act("pause"), "paused orders")
	require.Equal(t, []projection.State{projection.StatePaused, projection.StatePaused, projection.StatePaused, projection.StatePaused}, states())
	st, err := backend.StatusOf(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, "<b>ann</b>", st.StateChangedBy, "who paused it is recorded")
	since := st.StateChangedAt.UTC().Format("2006-01-02 15:04:05Z07:00")
	page := get(t, srv.URL+"/projections/orders")
	require.Contains(t, page, `id="resume"`)
	require.NotContains(t, page, `id="pause"`)
	require.Contains(t, page, `<dd id="paused-by">by &lt;b&gt;ann&lt;/b&gt; since `+since+`</dd>`, "who paused it, escaped")
	require.Contains(t, get(t, srv.URL+"/"), `paused by &lt;b&gt;ann&lt;/b&gt; since `+since, "the overview names who paused it too")
	require.Contains(t, act("pause"), "already paused by <b>ann</b> since ")
	require.Zero(t, ch.count(), "a pause publishes nothing")

	require.Contains(t, act("resume"), "resumed orders")
	require.Equal(t, []projection.State{projection.StateRunning, projection.StateRunning, projection.StateRunning, projection.StateRunning}, states())
	require.NotContains(t, get(t, srv.URL+"/projections/orders"), "paused by")
	require.NotContains(t, get(t, srv.URL+"/"), "paused by")
	require.Equal(t, 1, ch.count(), "a resume nudges the projection to catch up")
	require.Contains(t, act("resume"), "not paused")
	require.Equal(t, 1, ch.count(), "nothing resumed, nothing published")
}
