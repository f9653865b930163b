package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nudgeworks/nudge/channel/gochannel"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/worker"
)

// Example wires the metrics to a runner, a worker on a router of your own, and a dead-letter
// store, then serves them the way an HTTP /metrics endpoint would.
func Example() {
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	store, _ := esmemory.New(esmemory.Config{})
	backend, _ := pjmemory.New(store, pjmemory.Config{})
	list, _ := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(context.Context, projection.Event[ticket]) error { return nil }))

	// Your own registry: nothing goes to the global one.
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, Logger: logger})
	if err != nil {
		panic(err)
	}
	runner, _ := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger, OnBatch: m.ObserveBatch}, list)
	_ = runner.Init(ctx)
	ch, _ := gochannel.New(gochannel.Config{})
	defer ch.Close()
	dead := dlmemory.New(dlmemory.Config{})
	w, _ := worker.New(worker.Config{Runner: runner, Channel: ch, DeadLetters: dead, Logger: logger})

	for _, err := range []error{
		m.WatchRunner(runner),
		m.WatchWorker(w, runner.Names()...),
		m.WatchDeadLetters(dead, runner.Names()...),
	} {
		if err != nil {
			panic(err)
		}
	}
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NewSlogLogger(logger))
	if err := m.AddRouterMetrics(router); err != nil { // Watermill's handler metrics, same registry
		panic(err)
	}
	_ = w.AddHandlers(router) // after w.Prepare; then router.Run and go w.RunBackground

	for n := range 3 {
		data, _ := eventstore.NewEventData("TicketWasRegistered", ticket{N: n})
		_, _ = store.Append(ctx, fmt.Sprintf("ticket-%d", n), eventstore.NoStream, data)
	}
	_, _ = runner.CatchUp(ctx, "ticket_list") // what the worker does for a trigger

	// http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	scanner := bufio.NewScanner(rec.Body)
	for scanner.Scan() {
		line := scanner.Text()
		for _, name := range []string{"events_projected_total", "batches_total", "lag_events", "_state{", "dead_letters_failed", "catchups_total"} {
			if strings.Contains(line, "nudge_") && strings.Contains(line, name) && !strings.Contains(line, "version_state") && !strings.HasPrefix(line, "#") {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// nudge_dead_letters_failed{projection="ticket_list"} 0
	// nudge_projection_batches_total{outcome="committed",projection="ticket_list"} 1
	// nudge_projection_batches_total{outcome="error",projection="ticket_list"} 0
	// nudge_projection_batches_total{outcome="failed",projection="ticket_list"} 0
	// nudge_projection_events_projected_total{projection="ticket_list"} 3
	// nudge_projection_lag_events{projection="ticket_list"} 0
	// nudge_projection_state{projection="ticket_list",state="failing"} 0
	// nudge_projection_state{projection="ticket_list",state="paused"} 0
	// nudge_projection_state{projection="ticket_list",state="rebuilding"} 0
	// nudge_projection_state{projection="ticket_list",state="running"} 1
	// nudge_worker_catchups_total{projection="ticket_list"} 0
}
