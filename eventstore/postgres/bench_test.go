package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
)

// Every benchmark here runs twice: once through the store ("nudge") and once as a raw-pgx
// baseline ("raw") that sends the same SQL without the library (no validation, no retries, no
// error translation), so the difference is what the library costs.

// The baselines' SQL, copied from statements.go with the table names unqualified. Keep them in
// step with it.
const (
	benchLockStreamSQL = `SELECT version, last_transaction_id, pg_current_xact_id()
			FROM nudge_streams WHERE stream_id = $1 FOR UPDATE`
	benchInsertEventsSQL = `WITH ins AS (
				INSERT INTO nudge_events (event_id, stream_id, stream_version, event_type, payload, metadata)
				SELECT e.id, $1, $2::bigint + e.ord, e.type, e.payload::jsonb, e.metadata::jsonb
				FROM unnest($3::uuid[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(id, type, payload, metadata, ord)
				ORDER BY e.ord
				RETURNING global_position, transaction_id, recorded_at, stream_version
			), stream AS (
				INSERT INTO nudge_streams (stream_id, version, last_transaction_id)
				VALUES ($1, $2::bigint + cardinality($3::uuid[]), pg_current_xact_id())
				ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version,
					last_transaction_id = EXCLUDED.last_transaction_id, updated_at = EXCLUDED.updated_at
			)
			SELECT global_position, transaction_id, recorded_at FROM ins ORDER BY stream_version`
	benchReadSQL = `SELECT global_position, transaction_id, event_id, stream_id, stream_version, event_type, payload, metadata, recorded_at FROM nudge_events
			WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY transaction_id, global_position LIMIT $3`
)

const (
	// benchEventType is the type of every benchmark event.
	benchEventType = "TicketWasRegistered"
	// benchStreamsPerWriter is how many streams each appending goroutine rotates over, so that
	// writers never wait for each other's stream locks.
	benchStreamsPerWriter = 100
	// benchReadEvents and benchReadStreams size the store the read benchmarks page through.
	benchReadEvents  = 100_000
	benchReadStreams = 10_000
)

// benchPayload is a JSON object of about 200 bytes, the size of a typical event.
var benchPayload = []byte(`{"ticket_id":"T-2024-000123","customer_id":"c-7f3a9b21","channel":"email",` +
	`"subject":"Cannot download my invoice for March","priority":"high","tags":["billing","invoice"],` +
	`"received_at":"2024-03-14T09:26:53Z"}`)

// benchDB returns a migrated store on a fresh database, on a pool large enough for eight
// writers, and a pool of the same size for the baselines.
func benchDB(tb testing.TB) (*postgres.Store, *pgxpool.Pool) {
	tb.Helper()
	db := pgtest.New(tb)
	store, err := postgres.New(db.NewPool(tb, 16), postgres.Config{})
	require.NoError(tb, err)
	require.NoError(tb, store.Migrate(context.Background()))
	return store, db.NewPool(tb, 16)
}

// reportEvents reports the throughput of a benchmark that handled events events.
func reportEvents(b *testing.B, events int64) {
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}

// benchAppendFunc appends one transaction of events to stream.
type benchAppendFunc func(ctx context.Context, stream string) error

// BenchmarkAppend measures appends without event ids and with eventstore.Any, 1 or 10 events a
// transaction, from 1 or 8 goroutines, each goroutine on streams of its own.
func BenchmarkAppend(b *testing.B) {
	store, rawPool := benchDB(b)
	impls := []struct {
		name string
		// newAppend returns the append of one goroutine, for n events a transaction.
		newAppend func(n int) benchAppendFunc
	}{
		{"nudge", func(n int) benchAppendFunc {
			events := make([]eventstore.EventData, n)
			for i := range events {
				events[i] = eventstore.EventData{Type: benchEventType, Payload: benchPayload}
			}
			return func(ctx context.Context, stream string) error {
				_, err := store.Append(ctx, stream, eventstore.Any, events...)
				return err
			}
		}},
		{"raw", func(n int) benchAppendFunc { return rawAppend(rawPool, n) }},
	}
	for _, events := range []int{1, 10} {
		for _, writers := range []int{1, 8} {
			for _, impl := range impls {
				name := fmt.Sprintf("events=%d/writers=%d/%s", events, writers, impl.name)
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					runAppend(b, impl.name, events, writers, impl.newAppend)
					reportEvents(b, int64(b.N)*int64(events))
				})
			}
		}
	}
}

// runAppend runs b.N appends of events events each from writers goroutines.
func runAppend(b *testing.B, impl string, events, writers int, newAppend func(n int) benchAppendFunc) {
	ctx := context.Background()
	var nextWriter atomic.Int64
	// streams returns the streams of the next goroutine.
	streams := func() []string {
		w := nextWriter.Add(1)
		s := make([]string, benchStreamsPerWriter)
		for i := range s {
			s[i] = fmt.Sprintf("bench-%s-events%d-writer%d-%03d", impl, events, w, i)
		}
		return s
	}
	if writers == 1 {
		appendTx, own := newAppend(events), streams()
		b.ResetTimer()
		for i := range b.N {
			require.NoError(b, appendTx(ctx, own[i%len(own)]))
		}
		return
	}
	// RunParallel starts parallelism×GOMAXPROCS goroutines.
	procs := runtime.GOMAXPROCS(0)
	if writers%procs != 0 {
		b.Logf("%d writers do not divide among GOMAXPROCS=%d; running %d", writers, procs, (writers/procs+1)*procs)
	}
	b.SetParallelism((writers + procs - 1) / procs)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		appendTx, own := newAppend(events), streams()
		for i := 0; pb.Next(); i++ {
			if err := appendTx(ctx, own[i%len(own)]); err != nil {
				b.Error(err) // FailNow is for the benchmark's own goroutine only.
				return
			}
		}
	})
}

// rawAppend is the baseline of Store.Append for events without ids: the library's two
// statements in a transaction and nothing else.
func rawAppend(pool *pgxpool.Pool, n int) benchAppendFunc {
	types := make([]string, n)
	payloads := make([]string, n)
	metadata := make([]*string, n)
	for i := range n {
		types[i] = benchEventType
		payloads[i] = string(benchPayload)
	}
	return func(ctx context.Context, stream string) error {
		ids := make([][16]byte, n)
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7())
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }() // A no-op after Commit.
		var (
			version     int64
			lastTx, own uint64
		)
		err = tx.QueryRow(ctx, benchLockStreamSQL, stream).Scan(&version, &lastTx, &own)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		rows, err := tx.Query(ctx, benchInsertEventsSQL, stream, version, ids, types, payloads, metadata)
		if err != nil {
			return err
		}
		var (
			pos        eventstore.Position
			recordedAt time.Time
		)
		for rows.Next() {
			if err := rows.Scan(&pos.GlobalPosition, &pos.TransactionID, &recordedAt); err != nil {
				rows.Close()
				return err
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// benchReadFunc reads a page of up to limit events after after.
type benchReadFunc func(ctx context.Context, after eventstore.Position, limit int) ([]eventstore.Event, error)

// BenchmarkRead measures paging through a store of benchReadEvents events in the global read
// order, 100, 500 or 1000 events a page, starting over at the end.
func BenchmarkRead(b *testing.B) {
	store, rawPool := benchDB(b)
	ctx := context.Background()
	last := eventload.Load(b, rawPool, benchReadEvents, benchReadStreams, benchEventType,
		func(string, int) string { return string(benchPayload) })

	// The load is readable once no transaction older than it is running anywhere in the cluster.
	require.EventuallyWithT(b, func(c *assert.CollectT) {
		head, err := store.Head(ctx)
		require.NoError(c, err)
		require.Equal(c, last, head)
	}, time.Minute, 10*time.Millisecond, "the loaded events never became readable")

	impls := []struct {
		name string
		read benchReadFunc
	}{
		{"nudge", func(ctx context.Context, after eventstore.Position, limit int) ([]eventstore.Event, error) {
			return store.Read(ctx, after, eventstore.ReadOptions{Limit: limit})
		}},
		{"raw", func(ctx context.Context, after eventstore.Position, limit int) ([]eventstore.Event, error) {
			return rawRead(ctx, rawPool, after, limit)
		}},
	}
	for _, page := range []int{100, 500, 1000} {
		for _, impl := range impls {
			b.Run(fmt.Sprintf("page=%d/%s", page, impl.name), func(b *testing.B) {
				b.ReportAllocs()
				var (
					after eventstore.Position
					read  int64
				)
				b.ResetTimer()
				for range b.N {
					events, err := impl.read(ctx, after, page)
					require.NoError(b, err)
					read += int64(len(events))
					if len(events) < page || events[len(events)-1].Position == last {
						after = eventstore.Position{}
					} else {
						after = events[len(events)-1].Position
					}
				}
				reportEvents(b, read)
			})
		}
	}
}

// rawRead is the baseline of Store.Read: the library's SELECT, scanned by hand into the same
// fields.
func rawRead(ctx context.Context, pool *pgxpool.Pool, after eventstore.Position, limit int) ([]eventstore.Event, error) {
	rows, err := pool.Query(ctx, benchReadSQL, after.TransactionID, after.GlobalPosition, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	events := make([]eventstore.Event, 0, limit)
	for rows.Next() {
		var e eventstore.Event
		if err := rows.Scan(&e.Position.GlobalPosition, &e.Position.TransactionID, (*[16]byte)(&e.ID), &e.StreamID,
			&e.StreamVersion, &e.Type, (*[]byte)(&e.Payload), (*[]byte)(&e.Metadata), &e.RecordedAt); err != nil {
			return nil, err
		}
		events = append(events, e)
	}
	return events, rows.Err()
}

// TestBenchBaselines checks that the baselines still do the store's work: their SQL is a copy of
// the store's, and a baseline that drifted from it would measure something else.
func TestBenchBaselines(t *testing.T) {
	t.Parallel()
	store, rawPool := benchDB(t)
	ctx := context.Background()

	appendTx := rawAppend(rawPool, 3)
	require.NoError(t, appendTx(ctx, "raw"))
	require.NoError(t, appendTx(ctx, "raw"))
	res, err := store.Append(ctx, "raw", eventstore.Exact(6), eventstore.EventData{Type: benchEventType, Payload: benchPayload})
	require.NoError(t, err, "the store must accept a stream the baseline wrote")
	require.EqualValues(t, 7, res.StreamVersion)
	stream, err := store.ReadStream(ctx, "raw", 0, 0)
	require.NoError(t, err)
	require.Len(t, stream, 7)
	for i, e := range stream {
		require.EqualValues(t, i+1, e.StreamVersion)
		require.Equal(t, benchEventType, e.Type)
		require.JSONEq(t, string(benchPayload), string(e.Payload))
	}

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		head, err := store.Head(ctx)
		require.NoError(c, err)
		require.Equal(c, res.Last(), head)
	}, time.Minute, 10*time.Millisecond)
	// The two reads are two statements: a transaction elsewhere in the cluster may hold the
	// horizon back for one of them (it then reads less, never other events), so they are
	// compared until they agree on everything.
	for _, limit := range []int{1, 5, 100} {
		for k, after := range []eventstore.Position{{}, stream[2].Position} {
			left := []int{7, 4}[k] // the events after it
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				want, err := store.Read(ctx, after, eventstore.ReadOptions{Limit: limit})
				require.NoError(c, err)
				got, err := rawRead(ctx, rawPool, after, limit)
				require.NoError(c, err)
				require.Len(c, want, min(limit, left), "the store reads up to the head")
				require.Equal(c, want, got)
			}, time.Minute, 10*time.Millisecond)
		}
	}
}
