package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

// page is what every template gets.
type page struct {
	Title  string
	Base   string
	Writes bool
	CSRF   string
	// Live is the fragment URL the script polls to refresh the page's live part.
	Live string
	// Message is the outcome of the action that led here.
	Message string
	Data    any
}

// row is one projection on the overview.
type row struct {
	projection.Status
	DeadLetters int
	// Owners are the workers holding a partitioned projection's leases, sorted, and Unowned
	// counts its partitions no live worker holds; both empty without a lease table.
	Owners  []string
	Unowned int
	// Rate is the projection's throughput in events per second, RateKnown whether there is
	// one yet (see throughput).
	Rate      float64
	RateKnown bool
}

// overviewData is the overview's live part.
type overviewData struct {
	Rows []row
	At   time.Time
	// DeadLettersUnknown: there is no dead-letter table.
	DeadLettersUnknown bool
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	d, err := c.overviewData(r.Context())
	c.render(w, r, "overview", page{Title: "Projections", Live: c.basePath + "/live/overview", Data: d}, err)
}

func (c *console) overviewLive(w http.ResponseWriter, r *http.Request) {
	d, err := c.overviewData(r.Context())
	c.render(w, r, "overview-live", page{Data: d}, err)
}

// overviewData reads every projection's status (O(1) each, as 'nudge status' does) and the
// counts of failed dead letters.
func (c *console) overviewData(ctx context.Context) (overviewData, error) {
	all, err := c.backend.Statuses(ctx)
	if err != nil {
		return overviewData{}, fmt.Errorf("read the projections' status: %w", err)
	}
	counts, err := c.failedDeadLetters(ctx)
	unknown := isUndefinedTable(err)
	if err != nil && !unknown {
		return overviewData{}, fmt.Errorf("count the dead letters: %w", err)
	}
	all = projection.FoldPartitioned(all)
	now := c.now()
	processed := make(map[string]int64, len(all))
	for _, st := range all {
		processed[st.Name] = st.EventsProcessed
	}
	rates := c.rates.observeAll(processed, now)
	d := overviewData{Rows: make([]row, 0, len(all)), At: now.UTC(), DeadLettersUnknown: unknown}
	for _, st := range all {
		r := row{Status: st, DeadLetters: counts[st.Name]}
		r.Rate, r.RateKnown = rates[st.Name]
		r.Rate, r.RateKnown = orAverage(st, r.Rate, r.RateKnown, now)
		for _, p := range st.Partitions {
			r.DeadLetters += counts[p.Name] // a partition's dead letters are under its unit name
		}
		leases, err := c.leases(ctx, st)
		if err != nil {
			return d, err
		}
		for _, l := range leases {
			switch {
			case l.Owner == "":
				r.Unowned++
			case !slices.Contains(r.Owners, l.Owner):
				r.Owners = append(r.Owners, l.Owner)
			}
		}
		slices.Sort(r.Owners)
		d.Rows = append(d.Rows, r)
	}
	return d, nil
}

// orAverage is the throughput measured, or while none is known the average rate of a
// rebuilding projection since its reset.
func orAverage(st projection.Status, r float64, known bool, now time.Time) (float64, bool) {
	if !known {
		if avg := st.EventsPerSecond(now); avg > 0 {
			return avg, true
		}
	}
	return r, known
}

// leases returns the leases of a partitioned projection's partitions, in index order; nil
// for another projection, or without the lease table.
func (c *console) leases(ctx context.Context, st projection.Status) ([]lease.Lease, error) {
	if len(st.Partitions) == 0 {
		return nil, nil
	}
	count := max(st.Partitions[0].Partition.Count, len(st.Partitions))
	ls, err := lease.Leases(ctx, c.cfg.DB, c.cfg.Schema, st.Name, count)
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the partition leases of %s: %w", st.Name, err)
	}
	return ls, nil
}

// failedDeadLetters counts the failed dead letters of every projection.
func (c *console) failedDeadLetters(ctx context.Context) (map[string]int, error) {
	counts := map[string]int{}
	f := deadletter.Filter{Status: []deadletter.Status{deadletter.StatusFailed}, Limit: deadletter.ListLimitMax}
	for {
		recs, err := c.dead.List(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			counts[r.Projection]++
		}
		if len(recs) < f.Limit {
			return counts, nil
		}
		f.AfterID = recs[len(recs)-1].ID
	}
}

// projectionData is a projection page's live part.
type projectionData struct {
	projection.Status
	// Failing is the event the projection fails on, with its payload; nil when none.
	Failing *eventstore.Event
	Parked  []projection.ParkedStream
	Dead    []deadletter.Record
	// Done and Total are a rebuilding or building version's progress; ETA its time to level
	// (0 when unknown).
	Done, Total int64
	ETA         time.Duration
	// Rate is the projection's throughput in events per second, RateKnown whether there is
	// one yet (see throughput).
	Rate      float64
	RateKnown bool
	// Leases are a partitioned projection's partition leases, by index (nil without).
	Leases []lease.Lease
	// RequestAt is the database's clock now: a rebuild form sends it, so that submitting the
	// same form twice starts one rebuild.
	RequestAt string
}

func (c *console) projectionPage(w http.ResponseWriter, r *http.Request) {
	n := r.PathValue("name")
	d, err := c.projectionData(r.Context(), n)
	c.render(w, r, "projection", page{Title: n, Live: c.basePath + "/live/projections/" + n,
		Message: c.outcome(r), Data: d}, err)
}

func (c *console) projectionLive(w http.ResponseWriter, r *http.Request) {
	d, err := c.projectionData(r.Context(), r.PathValue("name"))
	c.render(w, r, "projection-live", page{Data: d}, err)
}

// errNoProjection is a page for a projection that has no status row.
var errNoProjection = errors.New("no such projection")

func (c *console) projectionData(ctx context.Context, n string) (projectionData, error) {
	if err := name.Validate(n); err != nil {
		return projectionData{}, fmt.Errorf("%w: %w", errNoProjection, err)
	}
	st, err := c.backend.StatusOf(ctx, n)
	if errors.Is(err, projection.ErrNotRegistered) {
		return projectionData{}, fmt.Errorf("%w: %s", errNoProjection, n)
	}
	if err != nil {
		return projectionData{}, fmt.Errorf("read the status of %s: %w", n, err)
	}
	d := projectionData{Status: st}
	now := c.now()
	d.Rate, d.RateKnown = c.rates.observe(st.Name, st.EventsProcessed, now)
	d.Rate, d.RateKnown = orAverage(st, d.Rate, d.RateKnown, now)
	if st.FailingEvent != nil {
		if d.Failing, err = c.event(ctx, st.FailingEvent.ID.String()); err != nil {
			return d, err
		}
	}
	if d.Parked, err = c.backend.ParkedStreams(ctx, pjpg.ParkedFilter{Projection: n}); err != nil && !isUndefinedTable(err) {
		return d, fmt.Errorf("read the parked streams of %s: %w", n, err)
	}
	d.Dead, err = c.dead.List(ctx, deadletter.Filter{Projection: n, Limit: 50})
	if err != nil && !isUndefinedTable(err) {
		return d, fmt.Errorf("read the dead letters of %s: %w", n, err)
	}
	if st.State == projection.StateRebuilding || st.VersionState == projection.VersionBuilding {
		d.Done, d.Total = st.Progress()
		if d.Rate > 0 {
			d.ETA = time.Duration(float64(st.LagEvents) / d.Rate * float64(time.Second)).Round(time.Second)
		}
	}
	if d.Leases, err = c.leases(ctx, st); err != nil {
		return d, err
	}
	var at time.Time
	if err := c.cfg.DB.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
		return d, fmt.Errorf("read the database's clock: %w", err)
	}
	d.RequestAt = at.UTC().Format(time.RFC3339Nano)
	return d, nil
}

// event reads one event by id, payload included; nil when it is gone.
func (c *console) event(ctx context.Context, id string) (*eventstore.Event, error) {
	var e eventstore.Event
	var payload, metadata *string
	err := c.cfg.DB.QueryRow(ctx, `SELECT event_id, stream_id, stream_version, event_type, payload::text, metadata::text, recorded_at
		FROM `+c.events+` WHERE event_id = $1`, id).Scan(&e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &payload, &metadata, &e.RecordedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read event %s: %w", id, err)
	}
	if payload != nil {
		e.Payload = []byte(*payload)
	}
	if metadata != nil {
		e.Metadata = []byte(*metadata)
	}
	return &e, nil
}

func (c *console) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		c.render(w, r, "deadletter", page{}, fmt.Errorf("%w: %q is not a dead letter's id", deadletter.ErrNotFound, r.PathValue("id")))
		return
	}
	rec, err := c.dead.Get(r.Context(), id)
	var ev *eventstore.Event
	if err == nil && rec.FailingEvent != nil {
		ev, err = c.event(r.Context(), rec.FailingEvent.ID.String())
	}
	c.render(w, r, "deadletter", page{Title: fmt.Sprintf("Dead letter %d", id), Message: c.outcome(r),
		Data: deadLetterData{Record: rec, Event: ev}}, err)
}

type deadLetterData struct {
	deadletter.Record
	Event *eventstore.Event
}

// render executes the template name into w, or an error page for err.
func (c *console) render(w http.ResponseWriter, r *http.Request, tmpl string, p page, err error) {
	p.Base, p.Writes = c.basePath, c.cfg.Writes
	code := http.StatusOK
	if err != nil {
		code = http.StatusInternalServerError
		switch {
		case errors.Is(err, errRefused):
			code = http.StatusBadRequest
		case errors.Is(err, errNoProjection) || errors.Is(err, deadletter.ErrNotFound):
			code = http.StatusNotFound
		}
		tmpl, p.Title, p.Live, p.Data = "error", http.StatusText(code), "", err.Error()
	}
	p.CSRF = c.csrfToken(w, r)
	var buf bytes.Buffer
	if err := c.pages.ExecuteTemplate(&buf, tmpl, p); err != nil {
		c.log.Error("console: render a page", slog.String("template", tmpl), slog.Any("error", err))
		http.Error(w, "the page failed to render; see the server's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// isUndefinedTable reports a query on a table that does not exist.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
