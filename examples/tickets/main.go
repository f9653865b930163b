// Tickets is a small HTTP service on nudge: tickets are event-sourced in PostgreSQL, and two
// projections — ticket_list (the list the API serves) and ticket_stats (open and closed
// tickets per customer) — are kept up to date asynchronously, triggered through RabbitMQ
// (--channel amqp, the default) or PostgreSQL queue tables (--channel postgres).
//
// One process runs everything (--mode all), or the API (--mode api) and any number of workers
// (--mode worker) run apart. At start every process migrates nudge's tables and registers the
// projections, whose init hooks create the read models.
//
// ticket_list's title column is narrower than the titles the API accepts, on purpose: a long
// title poisons it, and README.md walks through what happens next — retries, a dead letter,
// ticket_stats carrying on, the fix, the replay.
//
// Run it from the repository root, after `make up`:
//
//	go run ./examples/tickets
//	go run ./examples/tickets -h
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// readHeaderTimeout bounds how long a client may take to send a request's headers.
const readHeaderTimeout = 5 * time.Second

func main() { os.Exit(realMain()) }

func realMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tickets:", err)
		return 2
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if cfg.TraceStdout {
		exporter, err := stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
		if err != nil {
			cfg.Logger.Error("cannot export traces", slog.Any("error", err))
			return 1
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
		defer func() { _ = tp.Shutdown(context.Background()) }() // flushes the last spans
		cfg.TracerProvider = tp
	}
	var ln net.Listener
	if cfg.Mode.ServesHTTP() {
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			cfg.Logger.Error("cannot listen", slog.String("addr", cfg.Addr), slog.Any("error", err))
			return 1
		}
	}
	if err := serve(ctx, cfg, ln); err != nil {
		cfg.Logger.Error("tickets stopped", slog.Any("error", err))
		return 1
	}
	return 0
}

// serve opens the service and runs its mode until ctx ends (SIGINT or SIGTERM in main), then
// shuts down gracefully: the HTTP server stops taking requests and finishes those in flight
// (within cfg.ShutdownTimeout), then the worker and the relay stop (a batch in flight rolls
// back, a trigger in flight is nacked and comes back), then the connections close. ln is the
// HTTP listener (nil in worker mode); serve closes it.
func serve(ctx context.Context, cfg Config, ln net.Listener) error {
	svc, err := open(ctx, cfg)
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return err
	}
	defer svc.close()
	cfg = svc.cfg
	log := svc.log

	// The background parts outlive ctx until the HTTP server has drained: a request in flight
	// may still append, and the relay should publish its trigger.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	runErr := make(chan error, 1)
	go func() { runErr <- svc.run(bgCtx) }()

	var srv *http.Server
	srvErr := make(chan error, 1)
	if cfg.Mode.ServesHTTP() {
		if ln == nil {
			return fmt.Errorf("%w: mode %s serves HTTP but has no listener", ErrInvalidConfig, cfg.Mode)
		}
		srv = &http.Server{Handler: svc.handler(), ReadHeaderTimeout: readHeaderTimeout,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { srvErr <- srv.Serve(ln) }()
		log.Info("tickets started", slog.String("addr", ln.Addr().String()))
	} else {
		log.Info("tickets started")
	}

	var failure error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-runErr:
		failure = err
		runErr <- nil // collected again below
	case err := <-srvErr:
		failure = fmt.Errorf("http server: %w", err)
	}
	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		if err := srv.Shutdown(shutdownCtx); err != nil {
			log.Warn("http server shutdown did not finish in time", slog.Duration("timeout", cfg.ShutdownTimeout), slog.Any("error", err))
			_ = srv.Close()
		}
		cancel()
	}
	stopBackground()
	if err := <-runErr; err != nil && failure == nil {
		failure = err
	}
	if failure == nil {
		log.Info("tickets stopped")
	}
	return failure
}
