package worker

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// scriptedHolders returns the holder set by set, counting look-ups.
type scriptedHolders struct {
	mu      sync.Mutex
	holder  *eventstore.HorizonHolder
	lookups int
}

func (s *scriptedHolders) set(h *eventstore.HorizonHolder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holder, s.lookups = h, 0
}

func (s *scriptedHolders) HorizonHolder(context.Context) (*eventstore.HorizonHolder, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	if s.holder == nil {
		return nil, nil
	}
	h := *s.holder
	return &h, nil
}

// seen waits until the current holder has been looked up n times since it was set.
func (s *scriptedHolders) seen(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lookups >= n
	}, testwait.For(time.Minute), time.Millisecond)
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHorizonWarningOncePerHolder: a holder younger than HorizonWarnAfter is not reported; once
// older, one warning names it however often it is looked up again; its end is logged; the next
// holder gets a warning of its own.
func TestHorizonWarningOncePerHolder(t *testing.T) {
	src := &scriptedHolders{}
	var logs syncBuffer
	w := &Worker{
		cfg:    Config{Horizon: src, HorizonPollInterval: time.Millisecond, HorizonWarnAfter: 10 * time.Second},
		logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.watchHorizon(ctx) }()
	defer func() { cancel(); <-done }()

	holder := &eventstore.HorizonHolder{TransactionID: 41, PID: 7, Database: "reports", User: "etl",
		ApplicationName: "nightly-report", State: "idle in transaction", Started: time.Now(), Age: time.Second, HeldEvents: 12}
	src.set(holder)
	src.seen(t, 3)
	require.NotContains(t, logs.String(), "level=WARN", "younger than HorizonWarnAfter")

	older := *holder
	older.Age = 11 * time.Second
	src.set(&older)
	src.seen(t, 5)
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "level=WARN"), out)
	for _, want := range []string{"xid=41", "pid=7", "database=reports", "user=etl", "application_name=nightly-report", `state="idle in transaction"`, "held_events=12"} {
		require.Contains(t, out, want)
	}

	src.set(nil)
	src.seen(t, 2)
	require.Contains(t, logs.String(), "has ended")

	next := older
	next.TransactionID = 42
	src.set(&next)
	src.seen(t, 3)
	require.Equal(t, 2, strings.Count(logs.String(), "level=WARN"))
	require.Contains(t, logs.String(), "xid=42")
}
