package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	chamqp "github.com/nudgeworks/nudge/channel/amqp"
	chpg "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// ticketCount is how many events a rebuild test appends.
const ticketCount = 200

type ticket struct {
	N int `json:"n"`
}

// tickets is a projection into the table tickets whose worker the rebuild tests run.
type tickets struct {
	resets     atomic.Int64
	rebuilding atomic.Bool // set by the reset hook
	// gate, if set, holds every event handled after a reset until it is closed.
	gate chan struct{}
	// failOn, if not 0, is the event number the handler fails on after a reset.
	failOn int
	// resetErr, if set, makes the reset hook fail.
	resetErr error
}

func (tk *tickets) projection(t *testing.T) *projection.Projection {
	t.Helper()
	p, err := projection.New("tickets", projection.Config{
		BatchSize: 20,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS tickets (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			if tk.resetErr != nil {
				return tk.resetErr
			}
			tk.resets.Add(1)
			tk.rebuilding.Store(true)
			_, err := p.Tx.Exec(ctx, `TRUNCATE tickets`)
			return err
		},
	}, projection.On("TicketOpened", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticket]) error {
		if tk.rebuilding.Load() {
			if tk.gate != nil {
				select {
				case <-tk.gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if e.Data.N == tk.failOn {
				return fmt.Errorf("cannot take ticket %d", e.Data.N)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO tickets VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = tickets.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// rebuildSetup is a fixture with ticketCount TicketOpened events (and a few of another type)
// and the tickets projection's worker running on a channel, caught up.
type rebuildSetup struct {
	*fixture
	tk     *tickets
	runner *projection.Runner
}

// newRebuildSetup starts the worker of tk on the channel kind (channelAMQP or
// channelPostgres) and sets f.env so that the CLI publishes there.
func newRebuildSetup(t *testing.T, kind string, tk *tickets) *rebuildSetup {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	var data []eventstore.EventData
	for n := 1; n <= ticketCount; n++ {
		d, err := eventstore.NewEventData("TicketOpened", ticket{N: n})
		require.NoError(t, err)
		data = append(data, d)
		if n%50 == 0 {
			data = append(data, eventstore.EventData{Type: "Unrelated", Payload: json.RawMessage(`{}`)})
		}
	}
	res, err := store.Append(ctx, "tickets", eventstore.NoStream, data...)
	require.NoError(t, err)
	storetest.Settle(t, store, res.Last())
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, tk.projection(t))
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))

	var ch channel.Channel
	switch kind {
	case channelAMQP:
		env := amqptest.New(t)
		ch, err = chamqp.New(ctx, chamqp.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: logger})
		require.NoError(t, err)
		f.env[envAMQPURL], f.env[envAMQPPrefix] = env.URL, env.Prefix
	default:
		ch, err = chpg.New(f.db.NewPool(t, 10), chpg.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
		require.NoError(t, err)
	}
	w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: logger, SafetyNetInterval: -1, DeadLetters: f.store,
		DisableReplayOnStart: true, Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		if tk.gate != nil {
			select {
			case <-tk.gate:
			default:
				close(tk.gate)
			}
		}
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, ch.Close())
	})
	select {
	case <-w.Running():
	case <-time.After(waitCLI):
		t.Fatal("the worker did not start")
	}
	s := &rebuildSetup{fixture: f, tk: tk, runner: runner}
	require.Eventually(t, func() bool { return s.status(t).EventsProcessed == ticketCount }, waitCLI, 10*time.Millisecond,
		"the worker's start-up catch-up")
	return s
}

func (s *rebuildSetup) status(t *testing.T) projection.Status {
	t.Helper()
	st, err := s.runner.Status(context.Background(), "tickets")
	require.NoError(t, err)
	return st
}

// rows counts the rows of the read model and those written more than once.
func (s *rebuildSetup) rows(t *testing.T) (rows, wrong int) {
	t.Helper()
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM tickets`).Scan(&rows, &wrong))
	return rows, wrong
}

// TestRebuild: nudge rebuild asks the projection's worker, which runs the projection's own
// reset hook and rebuilds the read model; the command follows it to the end. On both
// channels the CLI publishes to.
func TestRebuild(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{channelPostgres, channelAMQP} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newRebuildSetup(t, kind, &tickets{})
			// Mark every row: the rebuild must write each again, once.
			_, err := s.db.Pool.Exec(context.Background(), `UPDATE tickets SET times = 100`)
			require.NoError(t, err)

			res := runCLI(t, s.env, "rebuild", "tickets", "--by", "alice")
			require.Equal(t, 0, res.code, "stdout: %s\nstderr: %s", res.stdout, res.stderr)
			require.Regexp(t, `^asked the worker of projection tickets to rebuild it \(request of \S+ by alice, on the `+kind+` channel\)\n`, res.stdout)
			require.Contains(t, res.stdout, fmt.Sprintf("rebuilt projection tickets: %d events in ", ticketCount))
			require.Contains(t, res.stderr, fmt.Sprintf("rebuilt tickets: %d/%d events (100%%)", ticketCount, ticketCount), "progress: done/total")

			require.Equal(t, int64(1), s.tk.resets.Load(), "the projection's own reset hook ran, once")
			rows, wrong := s.rows(t)
			require.Equal(t, ticketCount, rows)
			require.Zero(t, wrong, "every row written again by the rebuild, once")
			st := s.status(t)
			require.Equal(t, projection.StateRunning, st.State)
			require.Equal(t, int64(ticketCount), st.EventsProcessed)
			require.False(t, st.RebuildStartedAt.IsZero())
		})
	}
}

// TestRebuildNoWait: --no-wait returns once the request is sent, before the rebuild ends;
// status shows the rebuild's progress meanwhile.
func TestRebuildNoWait(t *testing.T) {
	t.Parallel()
	s := newRebuildSetup(t, channelPostgres, &tickets{gate: make(chan struct{})})

	res := runCLI(t, s.env, "reset", "tickets", "--no-wait")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "asked the worker of projection tickets to rebuild it")
	require.Contains(t, res.stdout, "not waiting; follow the rebuild with: nudge status tickets --watch")
	require.Empty(t, res.stderr, "no progress without waiting")

	// The worker holds the first event of the rebuild at the gate: the rebuild cannot have
	// ended when the command returned.
	var st projection.Status
	require.Eventually(t, func() bool {
		st = s.status(t)
		return st.State == projection.StateRebuilding
	}, waitCLI, 10*time.Millisecond)
	require.Equal(t, int64(1), s.tk.resets.Load())
	require.Zero(t, st.EventsProcessed)

	res = settledStatus(t, s.env, "status", "tickets")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, fmt.Sprintf("rebuilding: 0/%d events (0%%)", ticketCount))
	res = settledStatus(t, s.env, "status", "tickets", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Equal(t, "rebuilding", got[0]["state"])
	require.Equal(t, map[string]any{"done": 0.0, "total": float64(ticketCount), "percent": 0.0, "eta_seconds": nil}, got[0]["rebuild"], "no ETA before there is a rate")
	require.NotNil(t, got[0]["rebuild_started_at"])

	close(s.tk.gate)
	require.Eventually(t, func() bool {
		st := s.status(t)
		return st.State == projection.StateRunning && st.CaughtUp()
	}, waitCLI, 10*time.Millisecond)
	rows, wrong := s.rows(t)
	require.Equal(t, ticketCount, rows)
	require.Zero(t, wrong)
}

// TestRebuildFails: a handler that fails during the rebuild ends the command with exit 1,
// naming the event and the error.
func TestRebuildFails(t *testing.T) {
	t.Parallel()
	s := newRebuildSetup(t, channelPostgres, &tickets{failOn: 150})

	res := runCLI(t, s.env, "rebuild", "tickets")
	require.Equal(t, 1, res.code, res.stdout)
	st := s.status(t)
	require.Equal(t, projection.StateFailing, st.State)
	require.Contains(t, res.stderr, fmt.Sprintf("projection tickets failed on event %s (type TicketOpened, stream \"tickets\", position %s) after 149/",
		st.FailingEvent.ID, st.FailingEvent.Position))
	require.Contains(t, res.stderr, "cannot take ticket 150")
	require.Contains(t, res.stderr, "nudge deadletter replay --projection tickets")
	require.Contains(t, res.stderr, "nudge skip tickets --event "+st.FailingEvent.ID.String())
}

// TestRebuildResetHookFails: a reset hook that fails gets the request dead-lettered by the
// worker; the command finds it there and says so.
func TestRebuildResetHookFails(t *testing.T) {
	t.Parallel()
	s := newRebuildSetup(t, channelPostgres, &tickets{resetErr: errors.New("the search index is read-only")})

	res := runCLI(t, s.env, "rebuild", "tickets")
	require.Equal(t, 1, res.code, res.stdout)
	require.Contains(t, res.stderr, "the worker of projection tickets could not start the rebuild and dead-lettered the request (dead letter ")
	require.Contains(t, res.stderr, "the search index is read-only")
	require.Contains(t, res.stderr, "run 'nudge rebuild tickets' again")
	st := s.status(t)
	require.Equal(t, projection.StateRunning, st.State, "unchanged")
	require.True(t, st.RebuildStartedAt.IsZero())
}

// TestRebuildWithoutWorker: with no worker taking the request, --timeout ends the wait and
// Ctrl-C stops it; both say what goes on.
func TestRebuildWithoutWorker(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	ch, err := chpg.New(f.db.Pool, chpg.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })

	// No worker has run on the postgres channel, or none of this projection: refused before
	// sending.
	res := runCLI(t, f.env, "rebuild", "lagging")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "the postgres channel has no tables in this database (no worker has run on it here)")
	require.NoError(t, ch.Declare(context.Background(), "failing"))
	res = runCLI(t, f.env, "rebuild", "lagging")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "no worker of projection lagging has declared its subscription on the postgres channel")

	require.NoError(t, ch.Declare(context.Background(), "lagging"))
	res = runCLI(t, f.env, "rebuild", "lagging", "--timeout", "300ms")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "no worker took the request within 300ms: is a worker of projection lagging running on the postgres channel?")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr, wait := startCLI(t, ctx, f.env, "rebuild", "lagging")
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "asked the worker") }, waitCLI, 10*time.Millisecond)
	cancel()
	require.Equal(t, 1, wait(waitCLI))
	require.Contains(t, stderr.String(), "interrupted: stopped waiting, not the rebuild; the request stays with the channel until a worker takes it")

	res = runCLI(t, f.env, "rebuild", "nosuch")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, `no projection named "nosuch" in this database; the registered projections are: caught_up, failing, lagging`)
}

func TestRebuildBadInput(t *testing.T) {
	t.Parallel()
	db := map[string]string{envDatabaseURL: "postgres://localhost/x"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rebuild"}, "rebuild takes one projection name, got 0 arguments"},
		{[]string{"reset", "a", "b"}, "reset takes one projection name, got 2 arguments"},
		{[]string{"rebuild", "a", "--timeout", "-1s"}, "--timeout -1s is negative"},
		{[]string{"rebuild", "a", "--timeout", "later"}, `invalid value "later" for flag --timeout`},
		{[]string{"rebuild", "a", "--by", strings.Repeat("x", 201)}, "--by is longer than 200 characters"},
		{[]string{"rebuild", "Tickets"}, `invalid name "Tickets"`},
		{[]string{"rebuild", "a", "--channel", "kafka"}, "use amqp or postgres"},
	} {
		res := runCLI(t, db, c.args...)
		require.Equal(t, 2, res.code, c.args)
		require.Contains(t, res.stderr, c.want, c.args)
	}

	f := newStatusFixture(t)
	res := runCLI(t, f.env, "rebuild", "lagging", "--channel", "amqp")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "--channel amqp needs a RabbitMQ URL")

	res = runCLI(t, nil, "help", "reset")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "Usage: nudge reset PROJECTION")
	require.Contains(t, res.stdout, "Ctrl-C stops the waiting, not the rebuild")
	res = runCLI(t, nil, "help", "status")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "oldest_open_transaction_seconds")
	res = runCLI(t, nil, "help")
	require.Contains(t, res.stdout, "rebuild            PROJECTION")
	require.Contains(t, res.stdout, "status             [PROJECTION...]")
}

// TestProgress: on a terminal one line redrawn with \r, otherwise a line every few seconds;
// with a rate and an ETA once there are two samples.
func TestProgress(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	p := newProgress(&out, false)
	p.now = func() time.Time { return now }
	p.update("tickets", 0, 1000)
	now = now.Add(time.Second)
	p.update("tickets", 100, 1000) // within progressEvery: not printed
	now = now.Add(3 * time.Second)
	p.update("tickets", 400, 1000)
	p.finish("tickets", 1000, 1000, 10*time.Second)
	require.Equal(t, "rebuilding tickets: 0/1000 events (0%), rate -, ETA -\n"+
		"rebuilding tickets: 400/1000 events (40%), 100 events/s, ETA 6.0s\n"+
		"rebuilt tickets: 1000/1000 events (100%) in 10s\n", out.String())

	out.Reset()
	p = newProgress(&out, true)
	p.now = func() time.Time { return now }
	p.update("tickets", 0, 10)
	now = now.Add(time.Second)
	p.update("tickets", 5, 10)
	p.finish("tickets", 10, 10, 2*time.Second)
	second := "rebuilding tickets: 5/10 events (50%), 5 events/s, ETA 1.0s"
	last := "rebuilt tickets: 10/10 events (100%) in 2.0s"
	require.Equal(t, "\rrebuilding tickets: 0/10 events (0%), rate -, ETA -"+
		"\r"+second+"\r"+last+strings.Repeat(" ", len(second)-len(last))+"\n", out.String(), "a shorter line erases the longer one")
}
