package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgcluster"
)

// TestHorizonCommand: on a private cluster, `nudge horizon` says nothing holds the horizon, then
// names the session of a transaction in another database that holds an event back — with the
// escape sequences of its application name made harmless — in text and JSON.
func TestHorizonCommand(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitCLI)
	defer cancel()
	env := map[string]string{"NUDGE_DATABASE_URL": c.URL("postgres", "")}
	admin, err := pgx.Connect(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	_, err = admin.Exec(ctx, `CREATE DATABASE reports`)
	require.NoError(t, err)
	require.Equal(t, 0, runCLI(t, env, "migrate").code)

	res := runCLI(t, env, "horizon")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "Nothing holds the horizon")
	res = runCLI(t, env, "horizon", "--json")
	require.Equal(t, "null\n", res.stdout)

	cfg, err := pgx.ParseConfig(c.URL("reports", ""))
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "report \x1b[31mred"
	report, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = report.Close(context.Background()) }()
	tx, err := report.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	store, err := espg.New(admin, espg.Config{})
	require.NoError(t, err)
	_, err = store.Append(ctx, "held", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool { // the session reports itself idle a moment after its reply
		var state string
		err := admin.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, report.PgConn().PID()).Scan(&state)
		return err == nil && state == "idle in transaction"
	}, waitCLI, time.Millisecond)
	res = runCLI(t, env, "horizon")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^pid\s+`+strconv.Itoa(int(report.PgConn().PID()))+`$`, res.stdout)
	require.Regexp(t, `(?m)^database\s+reports$`, res.stdout)
	require.Regexp(t, `(?m)^holds back\s+1 committed events$`, res.stdout)
	require.Regexp(t, `(?m)^state\s+idle in transaction$`, res.stdout)
	require.NotContains(t, res.stdout, "\x1b", "no escape sequence reaches the terminal (PostgreSQL already turns it into ?)")

	res = runCLI(t, env, "horizon", "--json")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Equal(t, "reports", got["database"])
	require.InDelta(t, float64(report.PgConn().PID()), got["pid"], 0)
	require.Nil(t, got["writes_events"], "unknown for another database")
}
