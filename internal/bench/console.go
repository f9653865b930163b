package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// targetConsole: the console's overview must render fast however many events are behind
// (status reads are O(1) in the backlog).
var targetConsole = Target{Name: "console overview, 300 projections with a backlog, server time (median)", Op: AtMost, Threshold: 100, Unit: "ms"}

// consoleProjections is how many projections the console scenario registers.
const consoleProjections = 300

// runConsole times the console's overview (the handler's server time, httptest) over 300
// projections, each the whole store behind, the store loaded as the status scenario loads it.
func runConsole(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["projections"] = sz.statusEvents, consoleProjections
	sec.Params["max_runs"], sec.Params["min_runs"], sec.Params["budget_s"] = sz.statusRuns, statusMinRuns, sz.statusBudget.Seconds()
	f, err := h.newFixture(ctx, 4)
	if err != nil {
		return err
	}
	defer f.close()
	if err := loadTypedEvents(ctx, h, f, sz.statusEvents); err != nil {
		return err
	}
	types := [][]string{nil, {statusTypeRegistered}, {statusTypePaid, statusTypeCancelled}, {statusTypeSeat}, {statusTypeRefunded}}
	for i := range consoleProjections {
		name := fmt.Sprintf("console_%03d", i)
		var handlers []projection.Handler
		for _, t := range types[i%len(types)] {
			handlers = append(handlers, projection.OnIdempotent(t, func(context.Context, projection.Event[ticketRegistered]) error { return nil }))
		}
		if len(handlers) == 0 {
			handlers = append(handlers, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
		}
		p, err := projection.New(name, projection.Config{}, handlers...)
		if err != nil {
			return err
		}
		if err := f.backend.Register(ctx, p, nil); err != nil {
			return fmt.Errorf("register %s: %w", name, err)
		}
	}
	handler, err := console.New(console.Config{DB: f.db.pool, Logger: h.libLog})
	if err != nil {
		return err
	}
	var samples []time.Duration
	var size int
	started := time.Now()
	for round := range sz.statusRuns + 1 { // round 0 warms up
		if round > statusMinRuns && time.Since(started) > sz.statusBudget {
			break
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
		t0 := time.Now()
		handler.ServeHTTP(rec, req)
		took := time.Since(t0)
		if rec.Code != http.StatusOK {
			return fmt.Errorf("console overview: status %d: %s", rec.Code, rec.Body.String())
		}
		if rows := strings.Count(rec.Body.String(), "data-projection="); rows != consoleProjections {
			return fmt.Errorf("console overview shows %d projections, want %d", rows, consoleProjections)
		}
		size = rec.Body.Len()
		if round > 0 {
			samples = append(samples, took)
		}
		h.log.InfoContext(ctx, "console: overview rendered", slog.Int("round", round), slog.Duration("took", took.Round(time.Millisecond)))
	}
	med, mx := medianMs(samples), Ms(slices.Max(samples))
	sec.AddMetric(Metric{Case: "console overview, 300 projections", Name: "median_ms", Unit: "ms", Value: med,
		Extra: map[string]float64{"max_ms": mx, "runs": float64(len(samples)), "bytes": float64(size)}})
	sec.AddCheck(targetConsole, fmt.Sprintf("300 projections each %s events behind, max %s ms, %d bytes",
		Thousands(int64(sz.statusEvents)), FormatValue(mx, "ms"), size), med)
	sec.Note("server time: console.New's handler served through httptest.NewRecorder, no network; one Backend.Statuses " +
		"and one count of the failed dead letters per render, the page rendered with html/template")
	return nil
}
