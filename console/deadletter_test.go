package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/postgres"
)

// TestDeadLetterResolve: a dead letter's page shows its hostile error as text; resolving it
// from the page records who did it (the ActorHeader's value) and says so; resolving it again
// changes nothing and says who resolved it.
func TestDeadLetterResolve(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t, 4)
	ctx := t.Context()
	require.NoError(t, postgres.Migrate(ctx, pool, ""))
	store, err := dlpg.New(pool, dlpg.Config{})
	require.NoError(t, err)
	added, err := store.Add(ctx, deadletter.Entry{Projection: "orders", MessageUUID: uuid.NewString(), Payload: []byte(`{"projection":"orders"}`),
		Error: "handler failed: <script>alert(1)</script> \x1b[2J", Attempts: 3, At: time.Now(),
		FailingEvent: &eventstore.EventRef{ID: uuid.New(), Type: "OrderBad", StreamID: "order-1"}})
	require.NoError(t, err)
	id := added.ID

	h, err := console.New(console.Config{DB: pool, Channel: nopChannel{}, Writes: true, ActorHeader: "X-User", Logger: testlog.New(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	page := srv.URL + "/deadletters/" + itoa(id)
	cookie, token := formToken(t, page)
	body := get(t, page)
	require.Contains(t, body, `handler failed: &lt;script&gt;alert(1)&lt;/script&gt; \x1b[2J`)
	require.NotContains(t, body, "<script>alert")

	resolve := func() string {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/actions/resolve",
			strings.NewReader(url.Values{"id": {itoa(id)}, "note": {"fixed by hand"}, "csrf": {token}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-User", "ann")
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req) // follows the redirect to the outcome
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var b strings.Builder
		_, err = io.Copy(&b, resp.Body)
		require.NoError(t, err)
		return b.String()
	}
	require.Contains(t, resolve(), "resolved dead letter "+itoa(id)+" (by ann)")
	rec, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusResolved, rec.Status)
	require.Equal(t, "ann", rec.ResolvedBy)
	require.Equal(t, "fixed by hand", rec.ResolveNote)
	again := resolve()
	require.Contains(t, again, "was already resolved by ann")
	require.NotContains(t, again, `id="resolve"`, "no resolve form on a resolved dead letter")
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var b strings.Builder
	_, err = io.Copy(&b, resp.Body)
	require.NoError(t, err)
	return b.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
