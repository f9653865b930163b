package postgres_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

const (
	crashLoopURLEnv   = "NUDGE_CRASHLOOP_POSTGRES_URL"
	crashLoopFixedEnv = "NUDGE_CRASHLOOP_FIXED"
	crashLoopExit     = 7
	crashLoopPoison   = 13 // the event that kills the process
)

// crashLoopProjection counts events in a table; event crashLoopPoison makes the process exit
// mid-handler unless fixed.
func crashLoopProjection(t testing.TB, fixed bool) *projection.Projection {
	p, err := projection.New("killer", projection.Config{
		BatchSize:      10,
		CrashLoopLimit: projection.CrashLoopLimitSuggested,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS killer (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if e.Data.N == crashLoopPoison && !fixed {
			os.Exit(crashLoopExit) // no recover, no retry middleware can see this
		}
		_, err := tx.Exec(ctx, `INSERT INTO killer VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = killer.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestCrashLoopChild catches the killer projection up once, as a restarted worker would.
func TestCrashLoopChild(t *testing.T) {
	url := os.Getenv(crashLoopURLEnv)
	if url == "" {
		return // only runs as TestCrashLoopBecomesPoison's child
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := postgres.New(store)
	require.NoError(t, err)
	r := runner(t, backend, crashLoopProjection(t, os.Getenv(crashLoopFixedEnv) != ""))
	if _, err := r.CatchUp(ctx, "killer"); err != nil {
		fmt.Println("catch-up error:", err)
	}
}

// TestCrashLoopBecomesPoison: a handler that kills the process on one event never reaches any
// middleware. The runner counts batch starts without a finish, narrows the batch down to one
// event, and after the limit records that event as poison instead of handling it again, so the
// process survives. After the fix a replay (ClearCrashLoop) lets it through.
func TestCrashLoopBecomesPoison(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	positions := projectiontest.AppendN(t, e.store, 1, 20, "A")
	run := func(fixed bool) (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), crashLoopURLEnv+"="+e.db.URL, "GORACE=atexit_sleep_ms=0")
		if fixed {
			cmd.Env = append(cmd.Env, crashLoopFixedEnv+"=1")
		}
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns *ExitError itself
			return exit.ExitCode(), string(out)
		}
		require.NoError(t, err, "%s", out)
		return 0, string(out)
	}

	crashes := 0
	var out string
	for ; crashes < 20; crashes++ {
		var code int
		code, out = run(false)
		if code != crashLoopExit {
			require.Zero(t, code, out)
			break
		}
	}
	t.Logf("the process died %d times before the event was judged poison", crashes)
	require.Equal(t, 2*projection.CrashLoopLimitSuggested, crashes, "3 deaths in the full batch, 3 more on the event itself")
	require.Contains(t, out, "stopped 3 times while handling this event")

	r := runner(t, e.backend, crashLoopProjection(t, false))
	st, err := r.Status(context.Background(), "killer")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, positions[crashLoopPoison-1], st.FailingEvent.Position, "the poison event is named exactly")
	require.Equal(t, positions[crashLoopPoison-2], st.Position, "everything before it is committed")
	require.Contains(t, st.LastError, "fix the handler, then replay")
	var rows, wrong int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM killer`).Scan(&rows, &wrong))
	require.Equal(t, crashLoopPoison-1, rows)
	require.Zero(t, wrong)

	// Unfixed, a new start no longer dies: the event is not handed to the handler again.
	code, out := run(false)
	require.Zero(t, code, out)
	require.Contains(t, out, "stopped")

	// After the fix, a replay clears the verdict and the projection catches up.
	require.NoError(t, r.ClearCrashLoop(context.Background(), "killer"))
	code, out = run(true)
	require.Zero(t, code, out)
	require.NotContains(t, out, "catch-up error")
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM killer`).Scan(&rows, &wrong))
	require.Equal(t, 20, rows)
	require.Zero(t, wrong)
	st, err = r.Status(context.Background(), "killer")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
}
