package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/metrics"
)

func addDeadLetter(t testing.TB, s deadletter.Store, projection string) deadletter.Record {
	t.Helper()
	rec, err := s.Add(context.Background(), deadletter.Entry{Projection: projection, MessageUUID: uuid.NewString(),
		Error: "boom", FailingEvent: &eventstore.EventRef{ID: uuid.New(), Type: "Poison"}})
	require.NoError(t, err)
	return rec
}

// TestWatchDeadLetters: failed records are counted per projection (replayed and resolved ones
// are not); named projections show 0; a projection seen once goes back to 0, not away.
func TestWatchDeadLetters(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	store := dlmemory.New(dlmemory.Config{})
	require.NoError(t, m.WatchDeadLetters(store, "list", "stats"))

	expect := func(lines ...string) {
		t.Helper()
		expected := "# HELP nudge_dead_letters_failed Dead-letter records in status failed, waiting for a replay or an operator.\n" +
			"# TYPE nudge_dead_letters_failed gauge\n" + strings.Join(lines, "\n") + "\n"
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "nudge_dead_letters_failed"))
	}
	expect(`nudge_dead_letters_failed{projection="list"} 0`, `nudge_dead_letters_failed{projection="stats"} 0`)

	a := addDeadLetter(t, store, "list")
	addDeadLetter(t, store, "list")
	replayed := addDeadLetter(t, store, "list")
	other := addDeadLetter(t, store, "other")
	_, err := store.MarkReplayed(context.Background(), []int64{replayed.ID}, "test", time.Now())
	require.NoError(t, err)
	expect(`nudge_dead_letters_failed{projection="list"} 2`, `nudge_dead_letters_failed{projection="other"} 1`,
		`nudge_dead_letters_failed{projection="stats"} 0`)

	require.NoError(t, store.Resolve(context.Background(), a.ID, "test", "fixed", time.Now()))
	require.NoError(t, store.Resolve(context.Background(), other.ID, "test", "fixed", time.Now()))
	expect(`nudge_dead_letters_failed{projection="list"} 1`, `nudge_dead_letters_failed{projection="other"} 0`,
		`nudge_dead_letters_failed{projection="stats"} 0`)
	require.Equal(t, 0.0, mustValue(t, reg, "nudge_metrics_collect_errors_total", "source", metrics.SourceDeadLetters))

	require.ErrorIs(t, m.WatchDeadLetters(store), metrics.ErrAlreadyRegistered)
}

// pagedLister counts List calls and fails when told to.
type pagedLister struct {
	deadletter.Store
	calls atomic.Int64
	fail  atomic.Bool
}

func (p *pagedLister) List(ctx context.Context, f deadletter.Filter) ([]deadletter.Record, error) {
	p.calls.Add(1)
	if p.fail.Load() {
		return nil, errors.New("relation nudge_dead_letters does not exist")
	}
	return p.Store.List(ctx, f)
}

// TestWatchDeadLettersPages: more failed records than a page are all counted.
func TestWatchDeadLettersPages(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	store := &pagedLister{Store: dlmemory.New(dlmemory.Config{})}
	n := metrics.DeadLetterPageSize + 1
	for i := range n {
		addDeadLetter(t, store, fmt.Sprintf("p%d", i%2))
	}
	require.NoError(t, m.WatchDeadLetters(store))
	require.Equal(t, float64(n/2+1), mustValue(t, reg, "nudge_dead_letters_failed", "projection", "p0"))
	require.Equal(t, float64(n/2), mustValue(t, reg, "nudge_dead_letters_failed", "projection", "p1"))
	require.Equal(t, int64(2*2), store.calls.Load(), "two pages per scrape, two scrapes")
}

// TestWatchDeadLettersError: a failing store leaves the gauge out and counts the error; the
// scrape itself succeeds.
func TestWatchDeadLettersError(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	store := &pagedLister{Store: dlmemory.New(dlmemory.Config{})}
	store.fail.Store(true)
	require.NoError(t, m.WatchDeadLetters(store, "list"))
	_, found := value(t, reg, "nudge_dead_letters_failed")
	require.False(t, found)
	require.Equal(t, 2.0, mustValue(t, reg, "nudge_metrics_collect_errors_total", "source", metrics.SourceDeadLetters))
	store.fail.Store(false)
	require.Equal(t, 0.0, mustValue(t, reg, "nudge_dead_letters_failed", "projection", "list"))
}

func TestWatchDeadLettersRefusesBadInput(t *testing.T) {
	t.Parallel()
	m, _ := newMetrics(t)
	require.ErrorIs(t, m.WatchDeadLetters(nil), metrics.ErrInvalidConfig)
	require.ErrorIs(t, m.WatchDeadLetters(dlmemory.New(dlmemory.Config{}), "a", "a"), metrics.ErrInvalidConfig)
}
