package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

func TestTerminalSafe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"Ticket was priced: 12 € (é, 日本, \\x1b stays)", "Ticket was priced: 12 € (é, 日本, \\x1b stays)"},
		{"a\x1b[31mb\rc\u009bd é", `a\x1b[31mb\rc\u009bd é`},
		{"tab\tnl\nnul\x00del\x7f", `tab\tnl\nnul\x00del\x7f`},
		{"bad \xff\xfe utf8 \xe2\x82", `bad \xff\xfe utf8 \xe2\x82`},
		{"\uFFFD is a real replacement character", "\uFFFD is a real replacement character"},
	} {
		got := terminalSafe(tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
		require.Equal(t, got, terminalSafe(got), "escaping twice changes nothing: %q", tc.in)
	}
}

func TestTerminalSafeLines(t *testing.T) {
	require.Equal(t, "value \\x1b[31m\\r\nrun 'nudge status'", terminalSafeLines("value \x1b[31m\r\nrun 'nudge status'"))
}

func FuzzTerminalSafe(f *testing.F) {
	for _, s := range []string{"plain", "a\x1b[31mb\rc", "\u009b\x7f", "\xff\xc3", "é\u200b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := terminalSafe(s)
		require.True(t, utf8.ValidString(got), "%q", got)
		require.Equal(t, -1, strings.IndexFunc(got, unicode.IsControl), "%q", got)
		require.Equal(t, got, terminalSafe(got))
		if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
			require.Equal(t, s, got)
		}
	})
}

// TestHostileTextIsEscaped: a projection fails on an event whose payload holds an ANSI escape
// sequence and a carriage return; PostgreSQL quotes the offending value in its error, which
// becomes the projection's last error and a dead letter's error. `nudge status` and `nudge
// deadletter list/show` print that text escaped, never raw; --json keeps it exact.
func TestHostileTextIsEscaped(t *testing.T) {
	t.Parallel()
	const hostile = "\x1b[31mred\rX\u009b2J"
	f := newFixture(t)
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	payload, err := json.Marshal(map[string]string{"amount": hostile})
	require.NoError(t, err)
	res, err := store.Append(ctx, "ticket-\x1b[1m", eventstore.Any, eventstore.EventData{Type: "TicketPriced", Payload: payload})
	require.NoError(t, err)
	storetest.Settle(t, store, res.Last())
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	type priced struct{ Amount string }
	prices, err := projection.New("prices", projection.Config{}, projection.OnIdempotent("TicketPriced",
		func(ctx context.Context, e projection.Event[priced]) error {
			var n int
			return f.db.Pool.QueryRow(ctx, `SELECT $1::text::int`, e.Data.Amount).Scan(&n)
		}))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, prices)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, "prices")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.Contains(t, err.Error(), hostile, "PostgreSQL quotes the offending value as it is")

	ev := res.Events[0]
	rec, err := f.store.Add(ctx, deadletter.Entry{Projection: "prices", MessageUUID: "m-hostile", Payload: payload,
		Metadata: map[string]string{"note\r": hostile}, Error: err.Error(), Attempts: 1, At: time.Now(),
		FailingEvent: &eventstore.EventRef{ID: ev.ID, Type: ev.Type, StreamID: ev.StreamID, Position: ev.Position}})
	require.NoError(t, err)

	for _, args := range [][]string{
		{"status"},
		{"status", "prices"},
		{"deadletter", "list", "--projection", "prices"},
		{"deadletter", "show", strconv.FormatInt(rec.ID, 10)},
	} {
		out := runCLI(t, f.env, args...)
		require.Equal(t, 0, out.code, out.stderr)
		for _, raw := range []string{"\x1b", "\r", "\u009b"} {
			require.NotContains(t, out.stdout+out.stderr, raw, "nudge %s prints no raw %q", strings.Join(args, " "), raw)
		}
		require.Contains(t, out.stdout, `\x1b[`, "nudge %s shows the text escaped", strings.Join(args, " "))
	}

	out := runCLI(t, f.env, "deadletter", "show", strconv.FormatInt(rec.ID, 10), "--json")
	require.Equal(t, 0, out.code, out.stderr)
	require.NotContains(t, out.stdout, "\x1b")
	var shown struct {
		Error    string            `json:"error"`
		Metadata map[string]string `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal([]byte(out.stdout), &shown))
	require.Contains(t, shown.Error, hostile, "--json keeps the text exact, escaped by JSON")
	require.Equal(t, hostile, shown.Metadata["note\r"])

	out = settledStatus(t, f.env, "status", "prices", "--json")
	require.Equal(t, 0, out.code, out.stderr)
	require.NotContains(t, out.stdout, "\x1b")
	var st []struct {
		LastError string `json:"last_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(out.stdout), &st))
	require.Len(t, st, 1)
	require.Contains(t, st[0].LastError, hostile)
}
