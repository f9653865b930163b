package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	chpg "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// TestPauseResume: pause and resume change a projection's state by name, record who did it
// (--by, else $USER) and when, which status shows, escaped; doing either twice changes
// nothing and says so; resume publishes a catch-up trigger when a worker consumes from the
// channel, and says it catches up at its next trigger when none does; an unknown projection
// is an error (exit 1), a missing one a usage error (exit 2).
func TestPauseResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, backend := appendToOrder(t, f, "A", "A")
	ok := func(context.Context, projection.Event[json.RawMessage]) error { return nil }
	orders, err := projection.New("orders", projection.Config{}, projection.OnIdempotent("A", ok))
	require.NoError(t, err)
	parts, err := projection.New("parts", projection.Config{Partitions: 2}, projection.OnIdempotent("A", ok))
	require.NoError(t, err)
	r, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, orders, parts)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	status := func(name string) projection.Status {
		t.Helper()
		st, err := backend.StatusOf(ctx, name)
		require.NoError(t, err)
		return st
	}

	out := runCLI(t, f.env, "pause", "orders", "--by", "ann")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "paused projection orders (by ann)")
	st := status("orders")
	require.Equal(t, projection.StatePaused, st.State)
	require.Equal(t, "ann", st.StateChangedBy)
	since := st.StateChangedAt.UTC().Format(time.RFC3339)

	out = runCLI(t, f.env, "pause", "orders", "--by", "bob")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "projection orders was already paused by ann since "+since+": nothing changed")
	require.Equal(t, "ann", status("orders").StateChangedBy)

	out = settledStatus(t, f.env, "status", "orders")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "paused by ann since "+since+" (nudge resume orders)")
	out = settledStatus(t, f.env, "status", "orders", "--json")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, `"state_changed_by": "ann"`)

	// A name from the database is escaped before the terminal shows it.
	out = runCLI(t, f.env, "pause", "parts", "--by", "eve\x1b[2J")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, `paused projection parts (by eve\x1b[2J)`)
	require.Equal(t, "eve\x1b[2J", status("parts").StateChangedBy)
	out = settledStatus(t, f.env, "status", "parts")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, `paused by eve\x1b[2J since`)
	require.NotContains(t, out.stdout, "\x1b")

	// No worker consumes from the channel here: resumed all the same, and told so.
	out = runCLI(t, f.env, "resume", "orders")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "resumed projection orders (by tester (nudge cli))")
	require.Contains(t, out.stderr, "it catches up at its next trigger or safety-net tick")
	st = status("orders")
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, "tester (nudge cli)", st.StateChangedBy)
	out = runCLI(t, f.env, "resume", "orders", "--by", "bob")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "projection orders is not paused (running): nothing changed")
	require.Equal(t, "tester (nudge cli)", status("orders").StateChangedBy)

	// A worker's subscription: resume nudges the projection to catch up at once.
	ch, err := chpg.New(f.db.Pool, chpg.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Declare(ctx, "parts"))
	out = runCLI(t, f.env, "resume", "parts", "--by", "carl", "--channel", "postgres")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "resumed projection parts (by carl); triggered it to catch up on the postgres channel")
	require.Empty(t, out.stderr)
	var queued int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM nudge_channel_triggers`).Scan(&queued))
	require.Equal(t, 1, queued)
	require.Equal(t, projection.StateRunning, status("parts").State)

	out = runCLI(t, f.env, "pause", "missing")
	require.Equal(t, 1, out.code)
	require.Contains(t, out.stderr, "no projection named missing in this database")
	c := &cli{stdout: io.Discard, stderr: io.Discard, env: func(k string) string { return f.env[k] }}
	require.ErrorIs(t, c.dispatch(ctx, []string{"pause", "missing"}), projection.ErrNotRegistered)
	out = runCLI(t, f.env, "resume", "missing")
	require.Equal(t, 1, out.code)
	require.Contains(t, out.stderr, "no projection named missing in this database")
	out = runCLI(t, f.env, "pause")
	require.Equal(t, 2, out.code)
	out = runCLI(t, f.env, "resume", "a", "b")
	require.Equal(t, 2, out.code)
}
