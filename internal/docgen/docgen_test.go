package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReferenceUpToDate renders every page into memory and compares it with the committed
// file: a Config field, a command's help or a metric changed without `make docs` fails here.
func TestReferenceUpToDate(t *testing.T) {
	root, module, err := findModule("")
	require.NoError(t, err)
	for _, p := range pages {
		t.Run(filepath.Base(p.path), func(t *testing.T) {
			t.Parallel()
			want, err := p.render(root, module)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p.path)))
			require.NoError(t, err, "%s is missing: run make docs", p.path)
			require.Equal(t, string(want), string(got), "%s is stale: run make docs and commit it", p.path)
		})
	}
}

func TestListedCommands(t *testing.T) {
	usage := "nudge\n\nCommands:\n" +
		"  status             [PROJECTION...] [--json]\n" +
		"  deadletter list    [--projection P]\n" +
		"  deadletter show    ID [--json]\n" +
		"  migrate            create or upgrade the tables\n" +
		"                     (continued)\n" +
		"  help [command]     show this text\n\nGlobal flags:\n  --db URL  x\n"
	require.Equal(t, []string{"status", "deadletter", "deadletter list", "deadletter show", "migrate"}, listedCommands(usage))
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"nudge.Config":            "nudgeconfig",
		"channel/postgres.Config": "channelpostgresconfig",
		"nudge deadletter list":   "nudge-deadletter-list",
		"Why `make docs`?":        "why-make-docs",
		"Read models & lag_p99":   "read-models--lag_p99",
	} {
		require.Equal(t, want, slug(heading), heading)
	}
}

func TestFieldDefault(t *testing.T) {
	p := &pkgInfo{name: "worker", doc: nil}
	for text, want := range map[string]string{
		"Logger gets the logs. Defaults to slog.Default().":                     "slog.Default()",
		"Schema holds tables. Defaults to \"\", the search_path. Ignored by X.": "\"\", the search_path",
		"Interval is how often. Defaults to 30 s; negative turns it off.":       "30 s; negative turns it off",
		"Logger defaults to slog.Default(). Every line names it.":               "slog.Default()",
		"Relay tunes the relay; its Logger defaults to Logger.":                 "",
	} {
		require.Equal(t, want, fieldDefault(p, "X", text), text)
	}
}
