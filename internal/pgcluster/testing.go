package pgcluster

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// ForTest starts a private cluster for t and removes it when t ends. Where no cluster can be
// made here (no server programs, no postgres OS user when running as root), the test is skipped
// with the reason, unless CI=true, where it fails: CI machines must be able to run it.
func ForTest(t testing.TB) *Cluster {
	t.Helper()
	return ForTestWith(t, Options{})
}

// ForTestWith is ForTest with options.
func ForTestWith(t testing.TB, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(5*time.Minute))
	defer cancel()
	log := slog.New(slog.NewTextHandler(testlog.NewWriter(t), &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts.ProgramTimeout = cmp.Or(opts.ProgramTimeout, testwait.For(ProgramTimeoutDefault))
	c, err := NewWith(ctx, log, opts)
	if err != nil {
		msg := "pgcluster: cannot start a private PostgreSQL cluster: " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { c.Remove(context.Background()) })
	return c
}
