package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/deadletter"
)

// HTTP limits.
const (
	// maxBodyBytes bounds a request body.
	maxBodyBytes = 64 << 10
	// listLimitDefault and listLimitMax bound GET /tickets.
	listLimitDefault = 100
	listLimitMax     = 1000
	// healthTimeout bounds GET /healthz's database ping.
	healthTimeout = 2 * time.Second
	// replayedBy is who a replay through the API is recorded as.
	replayedBy = "tickets-api"
)

// readModelQuery runs read-model queries without pgx's prepared-statement cache. A read model's
// schema can change under a running API — ticket_list's init hook widens its title column when
// a worker starts with a wider --title-width — and a cached statement whose result type changed
// fails once per connection ("cached plan must not change result type"). The cost: parameters
// are sent as text, still in one round trip.
const readModelQuery = pgx.QueryExecModeExec

// handler returns the HTTP API:
//
//	POST /tickets              {"title", "customer"} → 201 {"id"}
//	POST /tickets/{id}/close   {"reason"} → 200; 404 unknown ticket, 409 already closed
//	GET  /tickets?status=open  the ticket_list read model (status, limit optional)
//	GET  /stats                the ticket_stats read model
//	GET  /status               every projection's state, position, lag, failure, dead letters
//	POST /replay?projection=P  replays P's dead letters (P = all: every projection's)
//	GET  /healthz              200 while the database answers
//	GET  /console/             the operator console (HTML, read-only): every projection,
//	                           its failing event, parked streams and dead letters
//
// Every response is JSON; every error is {"error": "..."} with a 4xx or 5xx status.
func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tickets", s.handleRegister)
	mux.HandleFunc("POST /tickets/{id}/close", s.handleClose)
	mux.HandleFunc("GET /tickets", s.handleList)
	mux.HandleFunc("GET /stats", s.handleStats)
	mux.HandleFunc("GET /status", s.handleStatus)
	mux.HandleFunc("POST /replay", s.handleReplay)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}))
	// The operator console, read-only: this API has no authentication. Behind your own, build it
	// with Writes: true and ActorHeader set to the header your proxy names the operator in.
	ops, err := console.New(console.Config{DB: s.pool, Schema: s.cfg.Schema, Channel: s.ch, BasePath: "/console", Logger: s.log})
	if err != nil {
		s.log.Error("tickets: the console is off", slog.Any("error", err))
	} else {
		mux.Handle("/console/", ops)
	}
	return traceContext(jsonErrors(mux))
}

// traceContext continues the caller's trace: the W3C trace context of the request's
// traceparent header, if any, becomes the parent of the spans the request starts, so the
// append's span, and through the events' metadata the batches that project them, join the
// caller's trace.
func traceContext(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

type registerRequest struct {
	Title    string `json:"title"`
	Customer string `json:"customer"`
}

type closeRequest struct {
	Reason string `json:"reason"`
}

func (s *service) handleRegister(w http.ResponseWriter, r *http.Request) {
	var req registerRequest
	if !decode(w, r, &req) {
		return
	}
	id, err := s.commands.register(r.Context(), req.Title, req.Customer)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id})
}

func (s *service) handleClose(w http.ResponseWriter, r *http.Request) {
	var req closeRequest
	if !decode(w, r, &req) {
		return
	}
	id := r.PathValue("id")
	if err := s.commands.closeTicket(r.Context(), id, req.Reason); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "status": string(StatusClosed)})
}

// ticketJSON is a row of ticket_list, of either version: GET /tickets selects every column of
// the view and maps them by name, so resolution_seconds (version 2) is absent while the view
// still shows version 1, in a process of either version (a rolling deploy runs both). A column
// this struct does not name fails the read: give a new column its field here, and deploy that,
// before the version that adds the column.
type ticketJSON struct {
	ID          string       `json:"id" db:"id"`
	Title       string       `json:"title" db:"title"`
	Customer    string       `json:"customer" db:"customer"`
	Status      TicketStatus `json:"status" db:"status"`
	OpenedAt    time.Time    `json:"opened_at" db:"opened_at"`
	ClosedAt    *time.Time   `json:"closed_at,omitempty" db:"closed_at"`
	CloseReason *string      `json:"close_reason,omitempty" db:"close_reason"`
	// ResolutionSeconds is how long a closed ticket was open (version 2 of ticket_list).
	ResolutionSeconds *float64 `json:"resolution_seconds,omitempty" db:"resolution_seconds"`
}

func (s *service) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var status *string // nil: every ticket
	if v := q.Get("status"); v != "" {
		if !slices.Contains(TicketStatuses(), TicketStatus(v)) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q: use one of %v, or leave it out for every ticket", v, TicketStatuses()))
			return
		}
		status = &v
	}
	limit := listLimitDefault
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > listLimitMax {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: use a number from 1 to %d", v, listLimitMax))
			return
		}
		limit = n
	}
	rows, err := s.pool.Query(r.Context(), `SELECT * FROM `+s.models.list+` WHERE $1::text IS NULL OR status = $1 ORDER BY opened_at, id LIMIT $2`,
		readModelQuery, status, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[ticketJSON])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tickets": list})
}

// customerStats is a row of ticket_stats.
type customerStats struct {
	Customer string `json:"customer"`
	Open     int    `json:"open"`
	Closed   int    `json:"closed"`
}

func (s *service) handleStats(w http.ResponseWriter, r *http.Request) {
	rows, err := s.pool.Query(r.Context(), `SELECT customer, open, closed FROM `+s.models.stats+` ORDER BY customer`, readModelQuery)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	stats, err := pgx.CollectRows(rows, pgx.RowToStructByPos[customerStats])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"customers": stats})
}

func (s *service) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.status(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// replayResponse is what POST /replay returns.
type replayResponse struct {
	// Replayed counts the dead letters marked replayed.
	Replayed int `json:"replayed"`
	// Projections got a replay trigger.
	Projections []string `json:"projections"`
}

func (s *service) handleReplay(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("projection")
	known := s.client.Runner().Names()
	var filter deadletter.ReplayFilter
	switch {
	case name == "all":
		filter.All = true
	case slices.Contains(known, name):
		filter.Projection = name
	case name == "":
		writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter projection is required: one of %v, or all", known))
		return
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown projection %q: use one of %v, or all", name, known))
		return
	}
	ch, err := s.triggerChannel(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := deadletter.Replay(r.Context(), s.client.DeadLetters(), ch, filter, replayedBy, time.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, p := range res.Projections {
		s.log.InfoContext(r.Context(), "dead letters replayed", slog.String("projection", p), slog.String("by", replayedBy))
	}
	writeJSON(w, http.StatusOK, replayResponse{Replayed: res.Replayed, Projections: append([]string{}, res.Projections...)})
}

func (s *service) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		s.log.WarnContext(r.Context(), "health check: database unreachable", slog.Any("error", err))
		writeError(w, http.StatusServiceUnavailable, "the database does not answer")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// fail answers err: 400, 404 and 409 for the commands' errors, else 500 (logged, not shown).
func (s *service) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrInvalidInput):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrTicketNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrAlreadyClosed):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrBrokerUnavailable):
		s.log.WarnContext(r.Context(), "request needs the broker, which is unavailable", slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusServiceUnavailable, ErrBrokerUnavailable.Error()+"; try again")
	case r.Context().Err() != nil:
		// The client went away (or the server is shutting down): nobody reads the answer.
		writeError(w, http.StatusServiceUnavailable, "request cancelled")
	default:
		s.log.ErrorContext(r.Context(), "request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, "internal error; see the service's log")
	}
}

// decode reads the request body as one JSON object into v, refusing unknown fields; on
// failure it answers 400 (413 for a body that is too large) and returns false.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	if err == nil {
		return true
	}
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		tooLarge  *http.MaxBytesError
	)
	msg := "request body: "
	switch {
	case errors.Is(err, io.EOF):
		msg += "empty; send a JSON object"
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit))
		return false
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		msg += "not valid JSON: " + err.Error()
	case errors.As(err, &typeErr):
		msg += fmt.Sprintf("field %s must be a %s, not a JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	default:
		msg += err.Error() // e.g. `json: unknown field "titel"`
	}
	writeError(w, http.StatusBadRequest, msg)
	return false
}

// errorJSON is the body of every error response.
type errorJSON struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorJSON{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client may be gone; nothing to do about it
}

// jsonErrors answers requests that match no route with a JSON 404, or 405 with the Allow
// header, instead of the mux's plain-text ones.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Let the mux's own handler set the status and the Allow header, without its body.
		probe := &statusProbe{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if allow := probe.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		switch probe.status {
		case http.StatusMethodNotAllowed:
			writeError(w, probe.status, fmt.Sprintf("method %s not allowed on %s; allowed: %s", r.Method, r.URL.Path, probe.header.Get("Allow")))
		case http.StatusNotFound:
			writeError(w, probe.status, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
		default: // a redirect (e.g. to a cleaned path): let the mux answer
			mux.ServeHTTP(w, r)
		}
	})
}

// statusProbe records the status and headers a handler writes, and drops the body.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}
func (p *statusProbe) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}
