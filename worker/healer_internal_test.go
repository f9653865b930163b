package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
)

// failingResolves is a dead-letter store whose ResolvePassed fails while fail is set; it records
// the positions asked for.
type failingResolves struct {
	deadletter.Store
	fail  atomic.Bool
	mu    sync.Mutex
	asked []eventstore.Position
}

func (f *failingResolves) ResolvePassed(ctx context.Context, name string, pos eventstore.Position, at time.Time) (int, error) {
	f.mu.Lock()
	f.asked = append(f.asked, pos)
	f.mu.Unlock()
	if f.fail.Load() {
		return 0, errors.New("dial tcp: connection refused")
	}
	return f.Store.ResolvePassed(ctx, name, pos, at)
}

func (f *failingResolves) calls() []eventstore.Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]eventstore.Position(nil), f.asked...)
}

// TestHealerRetriesAfterFailure: a resolve that fails is tried again after a wait, with the
// newest position signalled meanwhile (one pending resolve, not one per signal), until the
// store answers; then the healer waits for the next signal. It stops with its context.
func TestHealerRetriesAfterFailure(t *testing.T) {
	store := &failingResolves{Store: dlmemory.New(dlmemory.Config{})}
	store.fail.Store(true)
	w := &Worker{cfg: Config{DeadLetters: store, DeadLetterTimeout: time.Second}, logger: slog.New(slog.DiscardHandler),
		stats: map[string]*counters{"p": {}}}
	h := newHealer(w)
	h.retryInitial, h.retryMax = 10*time.Millisecond, 20*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { h.run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	pos := func(n int64) eventstore.Position { return eventstore.Position{TransactionID: 1, GlobalPosition: n} }
	h.signal("p", pos(1))
	require.Eventually(t, func() bool { return len(store.calls()) >= 3 }, time.Minute, time.Millisecond,
		"a failed resolve is tried again after a wait")
	for n := int64(2); n <= 50; n++ {
		h.signal("p", pos(n))
	}
	store.fail.Store(false)
	require.Eventually(t, func() bool { c := store.calls(); return c[len(c)-1] == pos(50) }, time.Minute, time.Millisecond,
		"the retry asks for the newest position signalled")
	settled := len(store.calls())
	require.Less(t, settled, 50, "49 signals during the failures coalesced")
	h.signal("p", pos(51))
	require.Eventually(t, func() bool { return len(store.calls()) == settled+1 }, time.Minute, time.Millisecond,
		"once the store answers, a signal is resolved at once, once")
	require.Equal(t, pos(51), store.calls()[settled])
}
