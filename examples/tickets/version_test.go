package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
)

// The tickets of the shape-change walk-through: "Ticket <n>" of customer customerOf(n),
// closed (if it is) with reasonOf(n), so a reader can check any answer on its own.
func titleOf(n int) string    { return "Ticket " + strconv.Itoa(n) }
func customerOf(n int) string { return []string{"acme", "globex", "initech"}[n%3] }
func reasonOf(n int) string   { return "fixed #" + strconv.Itoa(n) }

// TestShapeChangeWalkthrough is README.md's "Change the read model's shape", on both channels:
// a version 1 service runs with tickets, some closed; a version 2 process (a new column,
// resolution_seconds) starts beside it — a rolling deploy: version 1's worker keeps running.
// Version 2 adopts version 1's table (ticket_list becomes a view), builds its own from the
// start while version 1 serves (held mid-build by a hook, while more tickets come in) and cuts
// over by itself. A reader hits both processes' APIs throughout and checks every answer: every
// ticket it must have, each as registered and closed, in one shape (never empty, partial or
// mixed, never back to version 1 once version 2 showed). Afterwards every ticket shows its
// close_reason and resolution_seconds, each event handled once by version 2.
func TestShapeChangeWalkthrough(t *testing.T) {
	t.Parallel()
	eachChannel(t, shapeChangeWalkthrough)
}

func shapeChangeWalkthrough(t *testing.T, e *testEnv) {
	ctx := context.Background()
	config := func(version int) Config {
		cfg := e.config(ModeAll)
		cfg.ListVersion = version
		if e.kind == ChannelPostgres {
			cfg.Schema = "tix" // --schema: the versions' tables and the view live there
		}
		return cfg
	}
	v1 := e.start(config(1))
	next, closed, idOf := 0, map[int]bool{}, map[int]string{}
	register := func(api *instance, count int) {
		for range count {
			id := api.register(t, fmt.Sprintf(`{"title":%q,"customer":%q}`, titleOf(next), customerOf(next)))
			idOf[next] = id
			next++
		}
	}
	closeTicket := func(api *instance, n int) {
		api.call(t, http.MethodPost, "/tickets/"+idOf[n]+"/close", fmt.Sprintf(`{"reason":%q}`, reasonOf(n)), http.StatusOK, nil)
		closed[n] = true
	}
	register(v1, 8)
	for n := range 4 {
		closeTicket(v1, n)
	}
	v1.waitCaughtUp(t)
	list := v1.status(t).projection(t, ProjectionTicketList)
	require.Equal(t, 1, list.Version)
	require.Equal(t, projection.VersionActive, list.VersionState)
	for _, tk := range v1.tickets(t, "") {
		require.Nil(t, tk.ResolutionSeconds, "version 1 has no resolution_seconds")
	}

	// The reader, on both processes' APIs, from before version 2 is deployed to the end.
	r := &shapeReader{}
	r.min.Store(8)
	apis := []*instance{v1}
	var apisMu sync.Mutex
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			apisMu.Lock()
			api := apis[i%len(apis)]
			apisMu.Unlock()
			if !r.read(api) {
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()

	// Version 2 beside version 1, held at its first event of history.
	release, held := make(chan struct{}), make(chan struct{})
	var heldOnce sync.Once
	cfg := config(2)
	cfg.listV2Hook = func(ctx context.Context, replaying bool) error {
		if !replaying {
			return nil
		}
		heldOnce.Do(func() { close(held) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	v2 := e.start(cfg)
	apisMu.Lock()
	apis = append(apis, v2)
	apisMu.Unlock()
	select {
	case <-held:
	case <-time.After(waitFor):
		t.Fatalf("version 2 did not start its build within %s", waitFor)
	}
	var kinds []string
	rows, err := e.db.Pool.Query(ctx, `SELECT c.relname || ' ' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = coalesce(nullif($1, ''), 'public') AND c.relname LIKE 'ticket\_list%' AND c.relkind IN ('r', 'v') ORDER BY 1`, cfg.Schema)
	require.NoError(t, err)
	kinds, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"ticket_list v", "ticket_list_v1 r", "ticket_list_v2 r"}, kinds,
		"version 1's table was adopted: ticket_list is a view of ticket_list_v1, in the schema of the service")
	building := v2.status(t).projection(t, "ticket_list.v2")
	require.Equal(t, 2, building.Version)
	require.Equal(t, projection.VersionBuilding, building.VersionState)
	require.Equal(t, 1, building.ActiveVersion)
	require.Equal(t, projection.VersionActive, v1.status(t).projection(t, ProjectionTicketList).VersionState)

	// While version 2 builds, version 1 serves: new tickets, closings, through its own code.
	register(v1, 3)
	closeTicket(v1, 4)
	closeTicket(v1, 9)
	v1.waitCaughtUp(t)
	r.min.Store(11)
	readsBefore := r.reads.Load()
	require.Eventually(t, func() bool { return r.reads.Load() > readsBefore+2 || r.failed() }, waitFor, tick, "the reader reads during the build")
	require.Zero(t, r.versionTwoSeen.Load(), "readers see version 1 until the cut-over")

	// The build goes on and cuts over by itself.
	close(release)
	require.Eventually(t, func() bool {
		return v2.status(t).projection(t, "ticket_list.v2").VersionState == projection.VersionActive || r.failed()
	}, waitFor, tick, "version 2 cuts over")
	retired := v1.status(t).projection(t, ProjectionTicketList)
	require.Equal(t, projection.VersionRetired, retired.VersionState)
	require.Equal(t, 2, retired.ActiveVersion)

	// After the cut-over: version 2 handles what comes, in both processes' APIs.
	register(v1, 2)
	closeTicket(v1, 5)
	closeTicket(v1, 12)
	v2.waitCaughtUp(t)
	v1.waitCaughtUp(t) // a retired version is done
	r.min.Store(13)
	readsAfter := r.reads.Load()
	require.Eventually(t, func() bool { return r.reads.Load() > readsAfter+2 || r.failed() }, waitFor, tick, "the reader reads after the cut-over")
	close(stop)
	<-done
	require.NoError(t, r.err())
	require.Positive(t, r.versionTwoSeen.Load())

	for _, api := range []*instance{v1, v2} {
		tickets := api.tickets(t, "")
		require.Len(t, tickets, next, "every ticket, once")
		for n, tk := range tickets { // ordered by opened_at, as registered
			require.Equal(t, idOf[n], tk.ID)
			require.Equal(t, titleOf(n), tk.Title)
			if !closed[n] {
				require.Equal(t, StatusOpen, tk.Status)
				require.Nil(t, tk.ResolutionSeconds)
				continue
			}
			require.Equal(t, StatusClosed, tk.Status, "ticket %d", n)
			require.NotNil(t, tk.CloseReason)
			require.Equal(t, reasonOf(n), *tk.CloseReason)
			require.NotNil(t, tk.ResolutionSeconds, "ticket %d closed before, during or after the build", n)
			require.InDelta(t, tk.ClosedAt.Sub(tk.OpenedAt).Seconds(), *tk.ResolutionSeconds, 1e-3)
		}
	}
	active := v2.status(t).projection(t, "ticket_list.v2")
	require.EqualValues(t, next+len(closed), active.EventsProcessed, "version 2 handled every event once")
}

// shapeReader checks GET /tickets answers during a shape change.
type shapeReader struct {
	// min is how many tickets an answer must have at least.
	min            atomic.Int64
	reads          atomic.Int64
	versionTwoSeen atomic.Int64
	last           int
	mu             sync.Mutex
	failure        error
}

func (r *shapeReader) failed() bool { return r.err() != nil }

func (r *shapeReader) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// read reads GET /tickets from api once and checks the answer; false when it failed.
func (r *shapeReader) read(api *instance) bool {
	min := int(r.min.Load())
	res, err := api.send(http.MethodGet, "/tickets", "")
	if err == nil && res.status != http.StatusOK {
		err = fmt.Errorf("status %d: %s", res.status, res.body)
	}
	var out struct{ Tickets []ticketJSON }
	if err == nil {
		err = json.Unmarshal(res.body, &out)
	}
	if err == nil {
		err = r.check(out.Tickets, min)
	}
	if err != nil {
		r.mu.Lock()
		r.failure = fmt.Errorf("reader, answer %d: %w", r.reads.Load()+1, err)
		r.mu.Unlock()
		return false
	}
	r.reads.Add(1)
	return true
}

// check checks one answer: at least min tickets and no fewer than the answer before, each as
// registered (and closed), all in one version's shape, never version 1's after version 2's.
func (r *shapeReader) check(tickets []ticketJSON, min int) error {
	if len(tickets) < min || len(tickets) < r.last {
		return fmt.Errorf("%d tickets, after an answer with %d (at least %d expected)", len(tickets), r.last, min)
	}
	r.last = len(tickets)
	seen, withResolution, closedN := map[string]bool{}, 0, 0
	for _, tk := range tickets {
		n, err := strconv.Atoi(strings.TrimPrefix(tk.Title, "Ticket "))
		switch {
		case err != nil || titleOf(n) != tk.Title:
			return fmt.Errorf("unknown ticket %+v", tk)
		case seen[tk.ID]:
			return fmt.Errorf("ticket %s twice", tk.ID)
		case tk.Customer != customerOf(n):
			return fmt.Errorf("ticket %d: customer %q", n, tk.Customer)
		case tk.Status == StatusClosed && (tk.CloseReason == nil || *tk.CloseReason != reasonOf(n)):
			return fmt.Errorf("ticket %d: closed with reason %v", n, tk.CloseReason)
		case tk.Status == StatusOpen && (tk.ResolutionSeconds != nil || tk.CloseReason != nil):
			return fmt.Errorf("open ticket %d has %+v", n, tk)
		}
		seen[tk.ID] = true
		if tk.Status == StatusClosed {
			closedN++
		}
		if tk.ResolutionSeconds != nil {
			withResolution++
		}
	}
	switch {
	case withResolution > 0 && withResolution != closedN:
		return fmt.Errorf("mixed shapes: %d of %d closed tickets have resolution_seconds", withResolution, closedN)
	case withResolution == 0 && r.versionTwoSeen.Load() > 0:
		return errors.New("version 1's shape after version 2's")
	case withResolution > 0:
		r.versionTwoSeen.Add(1)
	}
	return nil
}
