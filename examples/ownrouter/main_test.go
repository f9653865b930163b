package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
)

// TestOwnRouter runs the example against the real RabbitMQ and PostgreSQL: the read model
// holds every greeting once, and triggers reached the projection's handler on the router.
func TestOwnRouter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	broker := amqptest.New(t)
	// The deadline only turns a hang into a failure; run returns as soon as the read model is
	// caught up.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, config{DatabaseURL: db.URL, AMQPURL: broker.URL, AMQPPrefix: broker.Prefix, Logger: slog.New(slog.DiscardHandler)}, &out)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"ann": 2, "bob": 1}, res.Greetings)
	require.Equal(t, "ann: 2\nbob: 1\n", out.String())
	require.NotZero(t, res.Triggers, "triggers went through RabbitMQ to the handler on the router")

	var times int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT times FROM greetings WHERE name = 'ann'`).Scan(&times))
	require.Equal(t, 2, times)
}
