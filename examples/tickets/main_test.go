package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestServe runs the service as main does, on a listener of its own, and shuts it down the
// way SIGTERM does: serve returns nil promptly and the port is closed.
func TestServe(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, e *testEnv) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		served := make(chan error, 1)
		go func() { served <- serve(ctx, e.config(ModeAll), ln) }()

		base := "http://" + ln.Addr().String()
		client := &http.Client{Timeout: testwait.For(30 * time.Second)}
		defer client.CloseIdleConnections()
		require.Eventually(t, func() bool {
			select {
			case err := <-served:
				served <- err // serve ended at start: reported below
				return true
			default:
			}
			res, err := client.Get(base + "/healthz")
			if err != nil {
				return false
			}
			_ = res.Body.Close()
			return res.StatusCode == http.StatusOK
		}, waitFor, tick, "the service answers once it has started")
		select {
		case err := <-served:
			t.Fatalf("serve returned at start: %v", err)
		default:
		}
		res, err := client.Post(base+"/tickets", "application/json", bytes.NewBufferString(bodyPrinter))
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusCreated, res.StatusCode)

		cancel() // SIGINT or SIGTERM
		select {
		case err := <-served:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Fatalf("serve did not return within %s of the signal", waitFor)
		}
		client.CloseIdleConnections()
		res, err = client.Get(base + "/healthz")
		if err == nil {
			_ = res.Body.Close()
		}
		require.Error(t, err, "the listener is closed")
	})
}

// TestServeFailsClearly: unreachable servers end serve at once with an error that says where
// it looked and what to check, without printing a password.
func TestServeFailsClearly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := Config{Channel: ChannelPostgres, Mode: ModeWorker, DatabaseURL: "postgres://postgres:s3cret@127.0.0.1:1/tickets?connect_timeout=2",
		Logger: slog.New(slog.DiscardHandler)}
	err := serve(ctx, cfg, nil)
	require.ErrorContains(t, err, `cannot reach PostgreSQL at 127.0.0.1:1 (database "tickets", user "postgres")`)
	require.ErrorContains(t, err, "NUDGE_DATABASE_URL")
	require.NotContains(t, err.Error(), "s3cret")

	cfg.DatabaseURL = "postgres://postgres:s3cret@127.0.0.1:5432/tickets?sslmode=bogus"
	err = serve(ctx, cfg, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.NotContains(t, err.Error(), "s3cret")

	cfg.Mode = "both"
	require.ErrorIs(t, serve(ctx, cfg, nil), ErrInvalidConfig)
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	var out bytes.Buffer

	cfg, err := parseConfig(nil, env(nil), &out)
	require.NoError(t, err)
	require.Equal(t, Config{
		DatabaseURL: DatabaseURLDefault, AMQPURL: AMQPURLDefault, Channel: ChannelAMQP, Mode: ModeAll, Addr: AddrDefault,
		TitleWidth: TitleWidthDefault, ListVersion: ListVersionDefault, SafetyNet: SafetyNetDefault, LogLevel: slog.LevelInfo,
	}, cfg, "the defaults")

	cfg, err = parseConfig([]string{"--channel", "postgres", "--title-width", "200"}, env(map[string]string{
		"NUDGE_DATABASE_URL": "postgres://db.internal/tickets", "NUDGE_CHANNEL": "amqp", "TICKETS_MODE": "worker",
		"TICKETS_REPLAY_ON_START": "false", "TICKETS_SAFETY_NET": "1m", "TICKETS_LOG_LEVEL": "debug", "NUDGE_SCHEMA": "tickets",
		"TICKETS_LIST_VERSION": "2", "TICKETS_TRACE_STDOUT": "true",
	}), &out)
	require.NoError(t, err)
	require.Equal(t, "postgres://db.internal/tickets", cfg.DatabaseURL, "the environment fills what no flag gives")
	require.Equal(t, ChannelPostgres, cfg.Channel, "a flag wins over the environment")
	require.Equal(t, ModeWorker, cfg.Mode)
	require.Equal(t, 200, cfg.TitleWidth)
	require.True(t, cfg.DisableReplayOnStart)
	require.Equal(t, time.Minute, cfg.SafetyNet)
	require.Equal(t, slog.LevelDebug, cfg.LogLevel)
	require.Equal(t, "tickets", cfg.Schema)
	require.Equal(t, 2, cfg.ListVersion)
	require.True(t, cfg.TraceStdout)

	for _, tc := range []struct {
		args []string
		env  map[string]string
		says string
	}{
		{[]string{"--mode", "both"}, nil, `mode "both": use one of [all api worker]`},
		{[]string{"--channel", "kafka"}, nil, `channel "kafka": use one of [amqp postgres]`},
		{[]string{"--title-width", "-1"}, nil, "title width -1: use 1 to 10485760"},
		{[]string{"--ticket-list-version", "3"}, nil, "ticket_list version 3: use one of [1 2]"},
		{nil, map[string]string{"TICKETS_SAFETY_NET": "often"}, "$TICKETS_SAFETY_NET"},
		{[]string{"--db", ""}, nil, "no database URL"},
		{[]string{"--mode", "api", "--addr", ""}, nil, "no HTTP address"},
		{[]string{"worker"}, nil, `unexpected arguments ["worker"]`},
	} {
		_, err := parseConfig(tc.args, env(tc.env), &out)
		require.ErrorIs(t, err, ErrInvalidConfig, "%v %v", tc.args, tc.env)
		require.ErrorContains(t, err, tc.says)
	}
	_, err = parseConfig([]string{"--no-such-flag"}, env(nil), &out)
	require.ErrorContains(t, err, "flag provided but not defined")

	out.Reset()
	_, err = parseConfig([]string{"-h"}, env(map[string]string{"NUDGE_DATABASE_URL": "postgres://u:s3cret@db/x"}), &out)
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, out.String(), "-title-width")
	require.NotContains(t, out.String(), "s3cret", "usage never shows the environment's values")
}
