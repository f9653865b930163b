package rabbitcluster

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// ForTest starts a private cluster of size nodes for t (see NewCluster) and removes it when t
// ends. Where no node can be started here (RabbitMQ is not installed), the test is skipped with
// the reason, unless CI=true, where it fails: CI machines must be able to run it.
func ForTest(t testing.TB, size int) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(5*time.Minute))
	defer cancel()
	log := slog.New(slog.NewTextHandler(testlog.NewWriter(t), &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := NewCluster(ctx, size, Options{Logger: log})
	if err != nil {
		msg := "rabbitcluster: cannot start a private RabbitMQ cluster: " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(c.Remove)
	return c
}
