package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/nudgetest"
)

// malformedURLs are connection strings url.Parse reads as a path or an opaque part.
var malformedURLs = []string{"amqp//guest:S3CR3T@host", "amqp:/guest:S3CR3T@host", "guest:S3CR3T@host:5672"}

// TestMalformedURLsKeepThePassword: a malformed --amqp or --db fails the service with an
// error, and logs, that never show the password.
func TestMalformedURLsKeepThePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := nudgetest.Database(t, nudgetest.Options{})
	for _, raw := range malformedURLs {
		var logs bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

		cfg := Config{Channel: ChannelAMQP, Mode: ModeWorker, DatabaseURL: db.URL, AMQPURL: raw, Logger: logger}
		err := serve(ctx, cfg, nil)
		require.Error(t, err, "--amqp %s", raw)
		require.Contains(t, err.Error(), "guest:xxxxx@host", "the error shows the URL, masked")
		require.NotContains(t, err.Error(), "S3CR3T")

		cfg = Config{Channel: ChannelPostgres, Mode: ModeWorker, DatabaseURL: raw, Logger: logger}
		err = serve(ctx, cfg, nil)
		require.Error(t, err, "--db %s", raw)
		require.NotContains(t, err.Error(), "S3CR3T")
		require.NotContains(t, logs.String(), "S3CR3T")
	}
}
