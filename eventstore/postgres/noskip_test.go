package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
)

// TestNoSkipUnderConcurrentWriters is the store's central promise: with many writers whose
// transactions stay open for random times, a reader that tails the store and keeps nothing but
// its position reads every committed event exactly once, each stream in version order. A naive
// reader ("global_position > P") tails the same writes beside it and must miss events: that shows
// the load really produces late commits, so the first reader's success means something.
func TestNoSkipUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		rollback float64 // share of transactions rolled back instead of committed
		exempt   bool    // each writer also runs exempt batches, on few pooled connections
	}{
		{"all commit", 0, false},
		{"some roll back", 0.15, false},
		// The commit-window race of the horizon (TestHorizonCommitWindow forces it) needs one
		// backend to commit an append and then an exempt batch while a reader scans pg_locks:
		// four connections for sixteen writers make every backend alternate all the time.
		{"appends and exempt batches alternate on pooled connections", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runNoSkip(t, tc.rollback, tc.exempt)
		})
	}
}

const (
	noSkipWriters = 16
	noSkipStreams = 250
	noSkipEvents  = 20_000
)

type committed struct {
	id      uuid.UUID
	stream  string
	version int64
}

func runNoSkip(t *testing.T, rollbackShare float64, exempt bool) {
	s, db := newStore(t, postgres.Config{})
	pool := db.NewPool(t, noSkipWriters+4)
	ctx := context.Background()
	var batches atomic.Int64
	if exempt {
		pool = db.NewPool(t, 4)
		_, err := pool.Exec(ctx, `CREATE TABLE read_model (n int)`)
		require.NoError(t, err)
	}

	var (
		mu        sync.Mutex
		written   []committed
		last      eventstore.Position
		total     atomic.Int64
		conflicts atomic.Int64
		rollbacks atomic.Int64
		writers   sync.WaitGroup
		readers   sync.WaitGroup
		stop      = make(chan struct{})
	)
	for w := range noSkipWriters {
		writers.Add(1)
		go func() {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for total.Load() < noSkipEvents {
				res, conflict, rolledBack, err := writeOnce(ctx, pool, s, rng, rollbackShare)
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				if conflict {
					conflicts.Add(1)
					continue
				}
				if rolledBack {
					rollbacks.Add(1)
					continue
				}
				if exempt {
					if err := exemptBatch(ctx, pool, s, rng); err != nil {
						t.Errorf("writer %d: exempt batch: %v", w, err)
						return
					}
					batches.Add(1)
				}
				mu.Lock()
				for _, r := range res {
					for _, e := range r.Events {
						written = append(written, committed{e.ID, e.StreamID, e.StreamVersion})
					}
					if last.Less(r.Last()) {
						last = r.Last()
					}
					total.Add(int64(len(r.Events)))
				}
				mu.Unlock()
			}
		}()
	}

	// The tailing reader persists nothing but its position. After stop, each reader makes one
	// more pass until a read comes back empty.
	var read []eventstore.Event
	readers.Add(2)
	go func() {
		defer readers.Done()
		var pos eventstore.Position
		stopping := false
		for {
			page, err := s.Read(ctx, pos, eventstore.ReadOptions{Limit: 500})
			if err != nil {
				t.Errorf("reader: %v", err)
				return
			}
			read = append(read, page...)
			if len(page) > 0 {
				pos = page[len(page)-1].Position
				continue
			}
			if stopping {
				return
			}
			select {
			case <-stop:
				stopping = true
			case <-time.After(time.Millisecond):
			}
		}
	}()
	naive := map[uuid.UUID]bool{}
	go func() {
		defer readers.Done()
		var pos int64
		stopping := false
		for {
			ids, next, err := naiveRead(ctx, pool, pos)
			if err != nil {
				t.Errorf("naive reader: %v", err)
				return
			}
			for _, id := range ids {
				naive[id] = true
			}
			if len(ids) > 0 {
				pos = next
				continue
			}
			if stopping {
				return
			}
			select {
			case <-stop:
				stopping = true
			case <-time.After(time.Millisecond):
			}
		}
	}()

	writers.Wait()
	// Everything committed is readable once the horizon has passed the last commit.
	storetest.Settle(t, s, last)
	close(stop)
	readers.Wait()
	require.False(t, t.Failed())

	t.Logf("committed %d events, %d conflicts retried, %d transactions rolled back, %d exempt batches",
		len(written), conflicts.Load(), rollbacks.Load(), batches.Load())
	require.GreaterOrEqual(t, len(written), noSkipEvents)

	// Every committed event read exactly once, nothing else read.
	want := make(map[uuid.UUID]committed, len(written))
	for _, c := range written {
		want[c.id] = c
	}
	seen := make(map[uuid.UUID]bool, len(read))
	versions := map[string]int64{}
	streams := map[string]bool{}
	for i, e := range read {
		require.False(t, seen[e.ID], "event %s read twice", e.ID)
		seen[e.ID] = true
		c, ok := want[e.ID]
		require.True(t, ok, "event %s was read but never committed", e.ID)
		require.Equal(t, c.stream, e.StreamID)
		require.Equal(t, versions[e.StreamID]+1, e.StreamVersion, "stream %s out of order at read %d", e.StreamID, i)
		versions[e.StreamID] = e.StreamVersion
		streams[e.StreamID] = true
		if i > 0 {
			require.True(t, read[i-1].Position.Less(e.Position), "positions strictly increase")
		}
	}
	require.Len(t, read, len(written), "every committed event is read")
	require.GreaterOrEqual(t, len(streams), 200)
	if rollbackShare > 0 {
		require.Positive(t, rollbacks.Load(), "the load rolled some transactions back")
	}

	missed := 0
	for _, c := range written {
		if !naive[c.id] {
			missed++
		}
	}
	t.Logf("the naive global_position > P reader missed %d of %d events", missed, len(written))
	require.Positive(t, missed, "the load produced no late commit, so it proved nothing")
}

// writeOnce runs one writer transaction: appends to one to three streams (in stream order, so
// writers never deadlock), holding the transaction open for 0–50 ms, sometimes between the
// appends too, then commits or rolls back. Conflicts are rolled back and reported for a retry.
func writeOnce(ctx context.Context, pool *pgxpool.Pool, s *postgres.Store, rng *rand.Rand, rollbackShare float64) (res []eventstore.AppendResult, conflict, rolledBack bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, false, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()

	streams := make([]int, 1+rng.IntN(3))
	for i := range streams {
		streams[i] = rng.IntN(noSkipStreams)
	}
	slices.Sort(streams)
	streams = slices.Compact(streams)
	for _, n := range streams {
		events := make([]eventstore.EventData, 1+rng.IntN(5))
		for i := range events {
			events[i] = storetest.Event("Written", rng.IntN(1000))
			events[i].ID = uuid.New()
		}
		r, err := s.AppendTx(ctx, tx, fmt.Sprintf("stream-%03d", n), eventstore.Any, events...)
		if errors.Is(err, eventstore.ErrConflict) {
			return nil, true, false, nil
		}
		if err != nil {
			return nil, false, false, err
		}
		res = append(res, r)
		if rng.Float64() < 0.3 {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
	}
	time.Sleep(time.Duration(rng.IntN(51)) * time.Millisecond)
	if rng.Float64() < rollbackShare {
		return nil, false, true, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, false, err
	}
	return res, false, false, nil
}

// exemptBatch runs a transaction like a projection batch's: exempt from the horizon, it writes
// a row of a read model and commits after 0–5 ms.
func exemptBatch(ctx context.Context, pool *pgxpool.Pool, s *postgres.Store, rng *rand.Rand) error {
	return pgx.BeginTxFunc(ctx, pool, s.ExemptTxOptions(pgx.TxOptions{}), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO read_model VALUES ($1)`, rng.IntN(1000)); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.IntN(6)) * time.Millisecond)
		return nil
	})
}

// naiveRead is the reader this store exists to replace: everything after a global position.
func naiveRead(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, after int64) ([]uuid.UUID, int64, error) {
	rows, err := q.Query(ctx, `SELECT event_id, global_position FROM nudge_events WHERE global_position > $1 ORDER BY global_position LIMIT 500`, after)
	if err != nil {
		return nil, after, err
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id, &after); err != nil {
			return nil, after, err
		}
		ids = append(ids, id)
	}
	return ids, after, rows.Err()
}
