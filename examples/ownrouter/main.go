// Ownrouter runs nudge's projection handlers on a Watermill router of your own, with triggers
// through RabbitMQ: the wiring for a service that already has a *message.Router — its own
// handlers, middleware and plugins — and adds one handler per projection beside them
// (Client.AddHandlers). You run the router; Client.RunBackground runs the rest of what
// Client.Run would: the relay, the replay after deploy and the safety net.
//
// It appends a few events, waits until the read model has them, prints it and stops. Run it
// from the repository root, after `make up`:
//
//	go run ./examples/ownrouter
//
// NUDGE_DATABASE_URL and NUDGE_AMQP_URL choose the servers (defaults: those of `make up`). Each
// run adds to the counts.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// Servers used when the environment names none: those of `make up` and docker-compose.yml.
const (
	databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres"
	amqpURLDefault     = "amqp://guest:guest@127.0.0.1:5672/"
)

// config says where the servers are.
type config struct {
	DatabaseURL string
	AMQPURL     string
	// AMQPPrefix starts the names of the exchanges and queues (tests share one broker).
	AMQPPrefix string
	Logger     *slog.Logger
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := config{
		DatabaseURL: cmp.Or(os.Getenv("NUDGE_DATABASE_URL"), databaseURLDefault),
		AMQPURL:     cmp.Or(os.Getenv("NUDGE_AMQP_URL"), amqpURLDefault),
		AMQPPrefix:  os.Getenv("NUDGE_AMQP_PREFIX"),
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ownrouter:", err)
		os.Exit(1)
	}
}

// Greeted is the example's one event type.
type Greeted struct {
	Name string `json:"name"`
}

// greetings counts the greetings per name in the table greetings, exactly once: the handler
// writes through the batch's transaction, which also commits the projection's position.
func greetings() (*projection.Projection, error) {
	return projection.New("greetings", projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS greetings (name text PRIMARY KEY, times int NOT NULL)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE greetings`)
			return err
		},
	}, projection.On("Greeted", func(ctx context.Context, tx pgx.Tx, e projection.Event[Greeted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO greetings VALUES ($1, 1) ON CONFLICT (name) DO UPDATE SET times = greetings.times + 1`, e.Data.Name)
		return err
	}))
}

// result is what a run did: the read model afterwards, and how many triggers reached the
// projection's handler on the router.
type result struct {
	Greetings map[string]int
	Triggers  int64
}

// run wires everything on the servers of cfg, greets three times, waits for the read model
// and prints it to out.
func run(ctx context.Context, cfg config, out io.Writer) (result, error) {
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return result{}, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: cfg.AMQPURL, Prefix: cfg.AMQPPrefix, Logger: cfg.Logger})
	if err != nil {
		return result{}, err
	}
	defer ch.Close()
	p, err := greetings()
	if err != nil {
		return result{}, err
	}
	client, err := nudge.New(pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{p}, Logger: cfg.Logger})
	if err != nil {
		return result{}, err
	}
	if err := client.Migrate(ctx); err != nil { // safe at every start, from several processes at once
		return result{}, err
	}

	// Your router: its config, logger, middleware, plugins and other handlers are yours.
	// worker.RouterLogger: the router's lines about a projection's handler carry "projection".
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, worker.RouterLogger(watermill.NewSlogLogger(cfg.Logger)))
	if err != nil {
		return result{}, err
	}
	router.AddMiddleware(middleware.CorrelationID)
	// router.AddConsumerHandler(…) for your own handlers, as before.
	// Status rows, init hooks and the projections' queues (before anything publishes), then one
	// handler per projection: dead letter → retry → recoverer.
	if err := client.AddHandlers(ctx, router); err != nil {
		return result{}, err
	}

	if err := runAll(ctx, router, client, func(ctx context.Context) error { return greet(ctx, client) }); err != nil {
		return result{}, err
	}
	res := result{Triggers: client.Worker().Stats("greetings").Received}
	if res.Greetings, err = readGreetings(ctx, pool); err != nil {
		return result{}, err
	}
	for _, name := range []string{"ann", "bob"} {
		fmt.Fprintf(out, "%s: %d\n", name, res.Greetings[name])
	}
	return res, nil
}

// runAll runs the router and the client's background (the relay; once the router runs, the
// replay after deploy, the start-up catch-up and the safety net) while work runs, then stops
// them and waits. If one of them stops by itself, work's context ends and runAll returns why.
func runAll(ctx context.Context, router *message.Router, client *nudge.Client, work func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	background := func(name string, fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(ctx); ctx.Err() == nil {
				cancel(fmt.Errorf("%s stopped: %w", name, cmp.Or(err, errors.New("without an error"))))
			}
		})
	}
	background("router", router.Run)
	background("nudge", client.RunBackground)
	select {
	case <-router.Running():
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if err := work(ctx); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
			return fmt.Errorf("%w (%w)", err, cause)
		}
		return err
	}
	return nil
}

// greet appends three greetings, as command handlers would, and waits until the projection
// has handled them — the relay publishes a trigger, RabbitMQ delivers it to the projection's
// handler on the router, and the handler catches the projection up — and until the relay has
// published its last trigger, so none is in flight when the program stops.
func greet(ctx context.Context, client *nudge.Client) error {
	for _, name := range []string{"ann", "bob", "ann"} {
		data, err := eventstore.NewEventData("Greeted", Greeted{Name: name})
		if err != nil {
			return err
		}
		if _, err := client.Append(ctx, "greeting-"+name, eventstore.Any, data); err != nil {
			return fmt.Errorf("append: %w", err)
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := client.WaitCaughtUp(waitCtx, "greetings"); err != nil {
		return err
	}
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		st, err := client.Relay().Status(waitCtx)
		if err == nil && st.Condition() == projection.ConditionCaughtUp {
			return nil
		}
		select {
		case <-waitCtx.Done():
			return fmt.Errorf("the relay did not catch up (its condition: %s): %w", st.Condition(), errors.Join(waitCtx.Err(), err))
		case <-time.After(pause):
		}
	}
}

// readGreetings reads the read model.
func readGreetings(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	rows, err := pool.Query(ctx, `SELECT name, times FROM greetings`)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	var (
		name  string
		times int
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &times}, func() error {
		counts[name] = times
		return nil
	})
	return counts, err
}
