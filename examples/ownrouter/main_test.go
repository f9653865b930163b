package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/projection"
)

// newKit returns a kit for the greetings projection on db.
func newKit(t *testing.T, db *nudgetest.DB) *nudgetest.Kit {
	t.Helper()
	p, err := greetings()
	require.NoError(t, err)
	return nudgetest.New(t, db, nudge.Config{Projections: []*projection.Projection{p}})
}

// TestGreetings tests the projection alone, without a broker: each greeting counts once.
func TestGreetings(t *testing.T) {
	t.Parallel()
	kit := newKit(t, nudgetest.Database(t, nudgetest.Options{}))
	for _, name := range []string{"ann", "bob", "ann"} {
		kit.Append(t, "greeting-"+name, nudgetest.Event(t, "Greeted", Greeted{Name: name}))
	}
	kit.RunToHead(t)
	kit.RequireRows(t, []nudgetest.Row{{"name": "ann", "times": 2}, {"name": "bob", "times": 1}},
		`SELECT name, times FROM greetings ORDER BY name`)
}

// TestOwnRouter runs the example against the real RabbitMQ and PostgreSQL: the read model
// holds every greeting once, and triggers reached the projection's handler on the router.
func TestOwnRouter(t *testing.T) {
	t.Parallel()
	db := nudgetest.Database(t, nudgetest.Options{})
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

	kit := newKit(t, db)
	kit.RequireRows(t, []nudgetest.Row{{"times": 2}}, `SELECT times FROM greetings WHERE name = 'ann'`)
	kit.RequireCondition(t, "greetings", projection.ConditionCaughtUp)
	kit.RequireDeadLetters(t, "greetings", 0)
}
