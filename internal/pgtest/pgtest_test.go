package pgtest_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

func TestNewGivesAnIsolatedDatabase(t *testing.T) {
	t.Parallel()
	a, b := pgtest.New(t), pgtest.New(t)
	require.NotEqual(t, a.Name, b.Name)
	ctx := context.Background()
	_, err := a.Pool.Exec(ctx, `CREATE TABLE only_in_a (id int)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'`).Scan(&n))
	require.Zero(t, n)

	var name string
	t.Run("dropped at the end", func(t *testing.T) {
		name = pgtest.New(t).Name
	})
	require.NoError(t, a.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n))
	require.Zero(t, n, "the subtest's database is gone once it ended")
}

// TestHoldHorizonTurnWaitsForTheHolder: while another session holds the turn, HoldHorizonTurn
// waits (its session shows an ungranted advisory lock); it gets the turn once that ends, and
// gives it back when its test ends.
func TestHoldHorizonTurnWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(1852339316)`) // may wait for other packages' tests
	require.NoError(t, err)

	got := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		t.Run("waiter", func(t *testing.T) {
			pgtest.HoldHorizonTurn(t)
			close(got)
		})
		close(ended)
	}()
	waiting := func() bool {
		var n int
		err := holder.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 1852339316 AND NOT granted`).Scan(&n)
		return err == nil && n > 0
	}
	require.Eventually(t, waiting, testwait.For(time.Minute), 5*time.Millisecond, "the waiter waits for the turn")
	select {
	case <-got:
		t.Fatal("the waiter got the turn while another session held it")
	default:
	}
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock(1852339316)`)
	require.NoError(t, err)
	<-ended
	select {
	case <-got:
	default:
		t.Fatal("the waiter ended without the turn")
	}
	var held bool
	require.Eventually(t, func() bool {
		return holder.QueryRow(ctx, `SELECT pg_try_advisory_lock(1852339316)`).Scan(&held) == nil && held
	}, testwait.For(10*time.Minute), 5*time.Millisecond, // tests of other checkouts may queue for it too
		"the turn is free again once the waiter's test ended")
}

// TestUnreachableServer runs this test binary again against a port nothing listens on: without
// CI the test is skipped with a hint, with CI=true it fails.
func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	if os.Getenv("PGTEST_CHILD") == "1" {
		pgtest.New(t)
		return
	}
	run := func(ci string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableServer$", "-test.v")
		cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", "CI="+ci,
			"NUDGE_TEST_POSTGRES_URL=postgres://postgres:secret@127.0.0.1:1/postgres?connect_timeout=2")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- SKIP")
	require.Contains(t, out, "make up")
	require.NotContains(t, out, "secret", "the password is never printed")

	out, err = run("true")
	require.Error(t, err, out)
	require.Contains(t, out, "--- FAIL")
	require.Contains(t, out, "is not reachable")
	require.NotContains(t, out, "secret")
}
