package main

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgbouncertest"
)

// TestThroughPgBouncer runs the commands that read and change state through PgBouncer in
// transaction pooling mode, where a client connection runs on whichever server connection is
// free: they answer as they do on a direct connection.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	b := pgbouncertest.Start(t, f.db.URL, pgbouncertest.Options{PoolSize: 2})
	bounced := map[string]string{envDatabaseURL: b.URL, "USER": "tester"}
	for _, args := range [][]string{
		{"status", "--json"},
		{"status"},
		{"deadletter", "list", "--json"},
		{"horizon"},
		{"migrate"},
	} {
		direct := runCLI(t, f.env, args...)
		require.Equal(t, 0, direct.code, direct.stderr)
		through := runCLI(t, bounced, args...)
		require.Equal(t, 0, through.code, "%v through %s: %s", args, b.Version, through.stderr)
		if len(args) == 2 && args[1] == "--json" {
			require.Equal(t, lagSeconds.ReplaceAllString(direct.stdout, ""), lagSeconds.ReplaceAllString(through.stdout, ""), args)
		}
	}
}

// lagSeconds matches the one field of status --json that changes from one call to the next.
var lagSeconds = regexp.MustCompile(`"lag_seconds": [0-9.e-]+`)
