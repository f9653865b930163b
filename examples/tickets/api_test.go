package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestTickets: register, close, and the read models and statuses show it, on both channels.
func TestTickets(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, e *testEnv) {
		api := e.start(e.config(ModeAll))

		var health map[string]string
		api.call(t, http.MethodGet, "/healthz", "", http.StatusOK, &health)
		require.Equal(t, "ok", health["status"])

		printer := api.register(t, bodyPrinter)
		coffee := api.register(t, bodyCoffee)
		vpn := api.register(t, bodyVPN)
		var closed map[string]string
		api.call(t, http.MethodPost, "/tickets/"+printer+"/close", bodyClose, http.StatusOK, &closed)
		require.Equal(t, map[string]string{"id": printer, "status": "closed"}, closed)

		st := api.waitCaughtUp(t)
		require.Equal(t, ModeAll, st.Mode)
		require.Equal(t, e.kind, st.Channel)
		for _, name := range []string{ProjectionTicketList, ProjectionTicketStats} {
			p := st.projection(t, name)
			require.Equal(t, "running", string(p.State), name)
			require.EqualValues(t, 4, p.EventsProcessed, "%s: three registrations and a closing, each once", name)
			require.Zero(t, p.LagEvents, name)
			require.Equal(t, p.Head, p.Position, name)
			require.Empty(t, p.DeadLetters, name)
			require.Nil(t, p.FailingEvent, name)
		}
		require.NotNil(t, st.Relay, "a relay publishes the triggers, on either channel")
		page := api.page(t, "/console/projections/"+ProjectionTicketList)
		require.Contains(t, page, `id="condition" class="c-caught_up">caught_up<`, "the console at /console shows the projection")
		require.Zero(t, st.Relay.LagEvents, "relay %+v", *st.Relay)

		all := api.tickets(t, "")
		require.Len(t, all, 3)
		byID := map[string]ticketJSON{}
		for _, tk := range all {
			byID[tk.ID] = tk
		}
		require.Equal(t, StatusClosed, byID[printer].Status)
		require.Equal(t, "Printer on fire", byID[printer].Title)
		require.Equal(t, "acme", byID[printer].Customer)
		require.NotNil(t, byID[printer].ClosedAt)
		require.Equal(t, "replaced the toner", *byID[printer].CloseReason)
		require.Equal(t, StatusOpen, byID[coffee].Status)
		require.Nil(t, byID[coffee].ClosedAt)
		require.Equal(t, StatusOpen, byID[vpn].Status)

		open := api.tickets(t, "?status=open")
		require.Equal(t, []string{coffee, vpn}, ids(open), "open tickets, oldest first")
		require.Equal(t, []string{printer}, ids(api.tickets(t, "?status=closed")))
		require.Len(t, api.tickets(t, "?limit=1"), 1)

		require.Equal(t, map[string]customerStats{
			"acme":   {Customer: "acme", Open: 1, Closed: 1},
			"globex": {Customer: "globex", Open: 1, Closed: 0},
		}, api.stats(t))

		// Nothing to replay: a replay of everything changes nothing.
		var replay replayResponse
		api.call(t, http.MethodPost, "/replay?projection=all", "", http.StatusOK, &replay)
		require.Equal(t, replayResponse{Replayed: 0, Projections: []string{}}, replay)
	})
}

func ids(tickets []ticketJSON) []string {
	out := make([]string, len(tickets))
	for i, tk := range tickets {
		out[i] = tk.ID
	}
	return out
}

// TestBadRequests: every refused request gets a 4xx with a JSON error that says what was
// wrong, and appends nothing.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, ChannelPostgres)
	api := e.start(e.config(ModeAll))
	id := api.register(t, bodyPrinter)
	api.call(t, http.MethodPost, "/tickets/"+id+"/close", bodyClose, http.StatusOK, nil)

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		says                     string
	}{
		{"bad JSON", "POST", "/tickets", `{"title":`, 400, "not valid JSON"},
		{"not JSON", "POST", "/tickets", `title=x`, 400, "not valid JSON"},
		{"empty body", "POST", "/tickets", ``, 400, "empty; send a JSON object"},
		{"empty title", "POST", "/tickets", `{"title":"","customer":"acme"}`, 400, "title: is required"},
		{"blank title", "POST", "/tickets", `{"title":"   ","customer":"acme"}`, 400, "title: is required"},
		{"no customer", "POST", "/tickets", `{"title":"Printer on fire"}`, 400, "customer: is required"},
		{"title too long", "POST", "/tickets", `{"title":"` + strings.Repeat("é", 201) + `","customer":"acme"}`, 400,
			"title: is 201 characters long; at most 200 allowed"},
		{"unknown field", "POST", "/tickets", `{"title":"A","customer":"acme","priority":1}`, 400, `unknown field "priority"`},
		{"wrong type", "POST", "/tickets", `{"title":1,"customer":"acme"}`, 400, "field title must be a string, not a JSON number"},
		{"two objects", "POST", "/tickets", `{"title":"A","customer":"acme"}{}`, 400, "more than one JSON value"},
		{"body too large", "POST", "/tickets", `{"title":"` + strings.Repeat("a", maxBodyBytes) + `"}`, 413, "larger than 65536 bytes"},
		{"unknown ticket", "POST", "/tickets/" + uuid.NewString() + "/close", bodyClose, 404, "ticket not found"},
		{"not a ticket id", "POST", "/tickets/printer/close", bodyClose, 404, `"printer" is not a ticket id`},
		{"no reason", "POST", "/tickets/" + id + "/close", `{}`, 400, "reason: is required"},
		{"double close", "POST", "/tickets/" + id + "/close", bodyClose, 409, "ticket is already closed: " + id + " was closed at"},
		{"unknown status", "GET", "/tickets?status=pending", "", 400, `status "pending": use one of [open closed]`},
		{"bad limit", "GET", "/tickets?limit=0", "", 400, "limit \"0\": use a number from 1 to 1000"},
		{"replay without projection", "POST", "/replay", "", 400, "query parameter projection is required: one of [ticket_list ticket_stats], or all"},
		{"replay of unknown projection", "POST", "/replay?projection=tickets", "", 400, `unknown projection "tickets"`},
		{"wrong method", "DELETE", "/tickets", "", 405, "method DELETE not allowed on /tickets; allowed: GET, HEAD, POST"},
		{"no such endpoint", "GET", "/ticket", "", 404, "no such endpoint: GET /ticket"},
	} {
		res := api.do(t, tc.method, tc.path, tc.body)
		require.Equal(t, tc.status, res.status, "%s: %s", tc.name, res.body)
		var body errorJSON
		require.NoError(t, json.Unmarshal(res.body, &body), "%s: %s", tc.name, res.body)
		require.Contains(t, body.Error, tc.says, tc.name)
		if tc.status == http.StatusMethodNotAllowed {
			require.Equal(t, "GET, HEAD, POST", res.header.Get("Allow"))
		}
	}

	var events int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM nudge_events`).Scan(&events))
	require.Equal(t, 2, events, "refused requests append nothing")
}

// TestConcurrentClose: of many concurrent closings of one ticket, exactly one succeeds; the
// others get 409, because each append expects the stream's version it decided on.
func TestConcurrentClose(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, ChannelPostgres)
	api := e.start(e.config(ModeAll))
	id := api.register(t, bodyPrinter)

	const closers = 8
	responses := make(chan response, closers)
	errs := make(chan error, closers)
	var wg sync.WaitGroup
	for range closers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := api.send(http.MethodPost, "/tickets/"+id+"/close", bodyClose)
			responses <- res
			errs <- err
		}()
	}
	wg.Wait()
	close(responses)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	counts := map[int]int{}
	for res := range responses {
		counts[res.status]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: closers - 1}, counts)
	events, err := api.svc.client.Store().ReadStream(context.Background(), streamID(id), 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 2, "one registration, one closing")
}

// TestSchema: with --schema, nudge's tables and the read models live in that schema, and
// ticket_list's init hook widens its title column there when the service starts with a wider
// --title-width — and never narrows it.
func TestSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newBareTestEnv(t, ChannelPostgres) // the service migrates its schema itself
	cfg := e.config(ModeAll)
	cfg.Schema = "helpdesk"
	api := e.start(cfg)
	id := api.register(t, bodyPrinter)
	api.call(t, http.MethodPost, "/tickets/"+id+"/close", bodyClose, http.StatusOK, nil)
	api.waitCaughtUp(t)
	require.Equal(t, []string{id}, ids(api.tickets(t, "?status=closed")))

	var tables []string
	rows, err := e.db.Pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'helpdesk'
		AND table_name IN ('nudge_events', 'nudge_projections', 'nudge_dead_letters', 'ticket_list', 'ticket_stats') ORDER BY 1`)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"nudge_dead_letters", "nudge_events", "nudge_projections", "ticket_list", "ticket_stats"}, tables)
	var public int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&public))
	require.Zero(t, public, "nothing in the search path's schema")

	width := func() int {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT character_maximum_length FROM information_schema.columns
			WHERE table_schema = 'helpdesk' AND table_name = 'ticket_list' AND column_name = 'title'`).Scan(&n))
		return n
	}
	require.Equal(t, TitleWidthDefault, width())
	for _, tc := range []struct{ start, want int }{{150, 150}, {120, 150}} {
		api.stop()
		cfg.TitleWidth = tc.start
		api = e.start(cfg)
		require.Equal(t, tc.want, width(), "started with --title-width %d", tc.start)
	}
	require.Equal(t, []string{id}, ids(api.tickets(t, "")), "the read model keeps its rows")
}
