package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClosest(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]string{
		"stauts":      "status", // two letters swapped
		"statu":       "status", // one missing
		"deadleter":   "deadletter",
		"deadletters": "deadletter",
		"rebiuld":     "rebuild",
		"migrat":      "migrate",
		"horizn":      "horizon",
		"dead":        "deadletter", // a beginning
		"sk":          "",           // too short to guess
		"frobnicate":  "",
		"list":        "",
	} {
		require.Equal(t, want, closest(got, commands), got)
	}
	require.Equal(t, "projection", closest("projcetion", []string{"projection", "status", "limit"}))
	require.Equal(t, "older-than", closest("older", []string{"older-than", "include-unresolved"}))
	require.Equal(t, 0, editDistance("status", "status"))
	require.Equal(t, 1, editDistance("stauts", "status"))
	require.Equal(t, 3, editDistance("", "abc"))
}

// TestDidYouMean: unknown commands, deadletter commands and flags get a suggestion.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, `unknown command "stauts" (did you mean "status"?); the commands are status,`},
		{[]string{"help", "rebiuld"}, `unknown command "rebiuld" (did you mean "rebuild"?)`},
		{[]string{"deadletters", "list"}, `unknown command "deadletters" (did you mean "deadletter"?)`},
		{[]string{"deadletter", "lst"}, `unknown deadletter command "lst" (did you mean "list"?); use list, show, replay, resolve or purge`},
		{[]string{"deadletter", "replya", "--all"}, `unknown deadletter command "replya" (did you mean "replay"?)`},
		{[]string{"deadletter", "list", "--projcetion", "x"}, "deadletter list: unknown flag --projcetion (did you mean --projection?); run 'nudge deadletter list --help' for its flags"},
		{[]string{"status", "--jsno"}, "unknown flag --jsno (did you mean --json?)"},
		{[]string{"--dbb", "x", "status"}, "unknown flag --dbb (did you mean --db?)"},
		{[]string{"status", "--frobnicate"}, "status: unknown flag --frobnicate; run"},
	} {
		res := runCLI(t, nil, tc.args...)
		require.Equal(t, 2, res.code, tc.args)
		require.Contains(t, res.stderr, tc.want, tc.args)
	}
}

// singleDashFlag is a flag written the flag package's way, with one dash.
var singleDashFlag = regexp.MustCompile(`(^|[\s\[(|'])-[a-z]([a-z-]|\b)`)

// TestHelpShowsDoubleDashes: every help text and flag error writes flags as --flag.
func TestHelpShowsDoubleDashes(t *testing.T) {
	t.Parallel()
	helps := [][]string{{"help"}, {"--help"}, {"-h"}, {"help", "deadletter"}, {"deadletter", "--help"}}
	for _, cmd := range []string{"status", "horizon", "rebuild", "reset", "skip", "migrate",
		"deadletter list", "deadletter show", "deadletter replay", "deadletter resolve", "deadletter purge"} {
		helps = append(helps, append(strings.Fields(cmd), "--help"), append([]string{"help"}, strings.Fields(cmd)...))
	}
	for _, args := range helps {
		res := runCLI(t, nil, args...)
		require.Equal(t, 0, res.code, "%v: %s", args, res.stderr)
		require.NotEmpty(t, res.stdout, args)
		require.NotRegexp(t, singleDashFlag, res.stdout, args)
		if strings.Contains(res.stdout, "Flags:\n") {
			require.Contains(t, res.stdout, "\n  --db URL\n", args)
		}
	}
	res := runCLI(t, nil, "skip", "--help")
	require.Contains(t, res.stdout, "  --reason TEXT\n    \twhy the event is skipped")
	require.Contains(t, res.stdout, "  --wait duration\n    \thow long to wait for the worker to do the skip (default 30s)")
	require.Contains(t, res.stdout, "  --force\n")

	for _, args := range [][]string{
		{"rebuild", "x", "--timeout", "later"},
		{"status", "--db"},
		{"status", "--watch=maybe"},
		{"rebuild"},
		{"skip"},
	} {
		res := runCLI(t, map[string]string{envDatabaseURL: "postgres://localhost/x"}, args...)
		require.Equal(t, 2, res.code, args)
		require.NotRegexp(t, singleDashFlag, res.stderr, args)
	}
}
