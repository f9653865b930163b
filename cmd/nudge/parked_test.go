package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	chamqp "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// parkedFixture: projection "tickets" (OnFailure park) parked two streams, one of them with
// an id that carries a terminal escape; "t-ok" flowed.
func parkedFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	var last eventstore.Position
	for _, stream := range []string{"t-bad", "t-ok", "t-\x1b[31mred", "t-bad"} {
		res, err := store.Append(ctx, stream, eventstore.Any, eventstore.EventData{Type: "T", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		last = res.Last()
	}
	storetest.Settle(t, store, last)
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, parkingTickets(t, false))
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	return f
}

// parkingTickets is the parked fixture's projection: it parks every stream but t-ok, unless fixed.
func parkingTickets(t *testing.T, fixed bool) *projection.Projection {
	t.Helper()
	p, err := projection.New("tickets", projection.Config{OnFailure: projection.OnFailurePark}, projection.OnIdempotent("T",
		func(_ context.Context, e projection.Event[json.RawMessage]) error {
			if e.StreamID != "t-ok" && !fixed {
				return retry.Permanent(errors.New("value too long \x1b[2J"))
			}
			return nil
		}))
	require.NoError(t, err)
	return p
}

// parkedWorker runs the worker of the parked fixture's projection on RabbitMQ until the test
// ends, and points the CLI at its channel. replayOnStart: it redrives the parked streams at start.
func parkedWorker(t *testing.T, f *fixture, fixed, replayOnStart bool) {
	t.Helper()
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, parkingTickets(t, fixed))
	require.NoError(t, err)
	env := amqptest.New(t)
	ch, err := chamqp.New(ctx, chamqp.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: logger})
	require.NoError(t, err)
	f.env[envAMQPURL], f.env[envAMQPPrefix] = env.URL, env.Prefix
	w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: logger, SafetyNetInterval: -1, DeadLetters: f.store,
		DisableReplayOnStart: !replayOnStart, Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, ch.Close())
	})
	select {
	case <-w.Running():
	case <-time.After(waitCLI):
		t.Fatal("the worker did not start")
	}
}

// TestParkedRedriveFailsFast: on RabbitMQ, a redrive the worker carries out at once and that
// fails again is reported as failed, promptly, with the new error — the attempts are read
// before the request goes out, so a failure faster than the first look is not missed.
func TestParkedRedriveFailsFast(t *testing.T) {
	t.Parallel()
	f := parkedFixture(t)
	parkedWorker(t, f, false, false)
	res := runCLI(t, f.env, "parked", "redrive", "tickets", "--stream", "t-bad", "--by", "ann", "--wait", "30s")
	require.Equal(t, 1, res.code, "stdout: %s\nstderr: %s", res.stdout, res.stderr)
	require.Contains(t, res.stdout, "asked the worker of projection tickets to redrive stream \"t-bad\"")
	require.Contains(t, res.stdout, `redrive failed: projection tickets, stream t-bad: value too long \x1b[2J`)
	require.NotContains(t, res.stdout, "\x1b")
	require.Contains(t, res.stderr, "the redrive failed again; the streams stay parked")
	require.NotContains(t, res.stderr, "is a worker running")
}

// TestParkedRedriveAlreadyRedriven: a redrive that finds the stream no longer parked (a
// starting worker redrove it) says by whom and when, and asks the worker for nothing.
func TestParkedRedriveAlreadyRedriven(t *testing.T) {
	t.Parallel()
	f := parkedFixture(t)
	parkedWorker(t, f, true, true)
	require.Eventually(t, func() bool {
		return strings.Contains(runCLI(t, f.env, "parked", "list").stdout, "No parked streams.")
	}, waitCLI, 20*time.Millisecond, "the starting worker redrives the parked streams")

	res := runCLI(t, f.env, "parked", "redrive", "tickets", "--stream", "t-bad", "--by", "ann")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `^stream t-bad of projection tickets is not parked; nothing to redrive: last stream t-bad redriven by worker start at \d{4}-\d\d-\d\dT\S+Z\n$`,
		res.stdout)
	res = runCLI(t, f.env, "parked", "redrive", "tickets", "--by", "ann")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "projection tickets has no parked streams; nothing to redrive: last stream ")
	require.Contains(t, res.stdout, " redriven by worker start at ")
	require.NotContains(t, res.stdout, "\x1b")
}

// TestParkedCommands: list, show, status and skip/purge of parked streams, with text from the
// database escaped for the terminal.
func TestParkedCommands(t *testing.T) {
	t.Parallel()
	f := parkedFixture(t)

	res := runCLI(t, f.env, "parked", "list")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "t-bad")
	require.NotContains(t, res.stdout, "\x1b", "escapes are shown, not sent")
	require.Contains(t, res.stdout, `t-\x1b[31mred`)

	res = runCLI(t, f.env, "parked", "list", "tickets", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, "t-bad", list[0]["stream_id"], "oldest first")
	require.InDelta(t, 1, list[0]["held_events"], 0)

	res = runCLI(t, f.env, "parked", "show", "tickets", "t-bad")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "held events:")
	require.Contains(t, res.stdout, "value too long")
	require.NotContains(t, res.stdout, "\x1b")
	res = runCLI(t, f.env, "parked", "show", "tickets", "nope")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "no parked stream")

	res = settledStatus(t, f.env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var st []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &st))
	require.InDelta(t, 2, st[0]["parked_streams"], 0)
	require.NotNil(t, st[0]["oldest_parked_at"])
	res = settledStatus(t, f.env, "status")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "2 parked streams")

	res = runCLI(t, f.env, "parked", "skip", "tickets", "--stream", "t-bad")
	require.Equal(t, 2, res.code, "a reason is required")
	res = runCLI(t, f.env, "parked", "skip", "tickets", "--stream", "t-bad", "--reason", "bad import", "--by", "ann")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "unparked stream t-bad of projection tickets without applying its 2 parked events (skip)")
	res = runCLI(t, f.env, "parked", "purge", "--all", "--reason", "drop", "--by", "ann")
	require.Equal(t, 0, res.code, res.stderr)
	res = runCLI(t, f.env, "parked", "list")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "No parked streams.")
	var actions int
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM nudge_projection_park_actions WHERE done_by = 'ann'`).Scan(&actions))
	require.Equal(t, 2, actions, "the skip and the purge are recorded")
}

// TestDeadletterListNotesParked: the dead letters' view of a projection mentions its parked
// streams, which hold failed events apart from the dead letters.
func TestDeadletterListNotesParked(t *testing.T) {
	t.Parallel()
	f := parkedFixture(t)
	res := runCLI(t, f.env, "deadletter", "list", "--projection", "tickets")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stderr, "note: 2 parked streams hold failed events apart from the dead letters; 'nudge parked list tickets' lists them")
}
