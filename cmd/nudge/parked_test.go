package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/retry"
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
	p, err := projection.New("tickets", projection.Config{OnFailure: projection.OnFailurePark}, projection.OnIdempotent("T",
		func(_ context.Context, e projection.Event[json.RawMessage]) error {
			if e.StreamID != "t-ok" {
				return retry.Permanent(errors.New("value too long \x1b[2J"))
			}
			return nil
		}))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	return f
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

	res = runCLI(t, f.env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var st []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &st))
	require.InDelta(t, 2, st[0]["parked_streams"], 0)
	require.NotNil(t, st[0]["oldest_parked_at"])
	res = runCLI(t, f.env, "status")
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
