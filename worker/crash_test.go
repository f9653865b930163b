package worker_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/channeltest"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// Environment of the crashing child process.
const (
	crashChildEnv  = "NUDGE_CRASH_CHILD_POSTGRES_URL"
	crashAMQPEnv   = "NUDGE_CRASH_CHILD_AMQP_URL"
	crashPrefixEnv = "NUDGE_CRASH_CHILD_AMQP_PREFIX"
	crashExitCode  = 3
)

// TestCrashChild is the child of TestTriggerSurvivesCrashAfterCommit: it appends events, commits,
// and dies in its relay right before the trigger would be published.
func TestCrashChild(t *testing.T) {
	dbURL := os.Getenv(crashChildEnv)
	if dbURL == "" {
		return // only runs as TestTriggerSurvivesCrashAfterCommit's child
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pgproj.New(store)
	require.NoError(t, err)
	ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: os.Getenv(crashAMQPEnv), Prefix: os.Getenv(crashPrefixEnv)})
	require.NoError(t, err)
	for n := range 5 {
		_, err := store.Append(ctx, "crash", eventstore.Any, storeEvent(n))
		require.NoError(t, err)
	}
	rel, err := relay.New(backend, ch, relay.Config{
		BeforePublishFunc: func(trigger.Trigger) { os.Exit(crashExitCode) }, // the process dies here
	})
	require.NoError(t, err)
	_ = rel.Run(ctx)
	t.Fatal("the relay returned instead of dying before its publish")
}

// TestTriggerSurvivesCrashAfterCommit: a process appends, commits and dies between the commit
// and the broker publish. Its events are committed, no trigger went out; the relay of the next
// process to start publishes it, so the projection's queue gets it after the restart.
func TestTriggerSurvivesCrashAfterCommit(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	env := amqptest.New(t)
	ctx := context.Background()
	ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: s.logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	require.NoError(t, ch.Declare(ctx, "alpha"))

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+s.db.URL, crashAMQPEnv+"="+env.URL, crashPrefixEnv+"="+env.Prefix,
		"GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, crashExitCode, exit.ExitCode(), "the child died in its relay, before publishing: %s", out)

	committed, err := s.store.ReadStream(ctx, "crash", 0, 0)
	require.NoError(t, err)
	require.Len(t, committed, 5, "the appends committed before the crash")

	// The restarted process's relay publishes what the dead one could not: once the five
	// events are readable (an open transaction elsewhere in the cluster may delay that), in one
	// coalesced trigger.
	storetest.Settle(t, s.store, committed[4].Position)
	rel, err := relay.New(s.backend, ch, relay.Config{Logger: s.logger})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rel.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	msgs := channeltest.Consume(t, ch, "alpha")
	got := channeltest.Next(t, msgs)
	require.Equal(t, trigger.ReasonAppend, got.Reason)
	require.Equal(t, committed[4].Position, got.Position, "the trigger covers every committed event")
	require.Equal(t, []string{"A"}, got.Types)
	require.Eventually(t, func() bool {
		st, err := rel.Status(ctx)
		return err == nil && st.CaughtUp() && st.Position == committed[4].Position
	}, eventually, 10*time.Millisecond)
}
