// Package eventload fills a migrated PostgreSQL event store fast, with COPY, for benchmarks:
// events spread over streams the way appends would have left them.
package eventload

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// CopyBatch is how many events one COPY (one transaction) loads.
const CopyBatch = 5_000

// StreamID names stream n the way Load does.
func StreamID(n int) string { return fmt.Sprintf("ticket-%05d", n) }

// Load copies events events of type eventType into the tables of the event store in the
// pool's search path: event i is version i/streams+1 of stream StreamID(i%streams), with the
// JSON payload payloadFunc(stream, i). It fills nudge_streams to match, analyses both tables,
// and returns the last event's position.
func Load(tb testing.TB, pool *pgxpool.Pool, events, streams int, eventType string, payloadFunc func(stream string, i int) string) eventstore.Position {
	tb.Helper()
	return LoadTyped(tb, pool, events, streams, func(int) string { return eventType }, payloadFunc)
}

// LoadTyped is Load with the type of event i given by typeFunc(i), for a store of several
// event types.
func LoadTyped(tb testing.TB, pool *pgxpool.Pool, events, streams int, typeFunc func(i int) string, payloadFunc func(stream string, i int) string) eventstore.Position {
	tb.Helper()
	ctx := context.Background()
	columns := []string{"event_id", "stream_id", "stream_version", "event_type", "payload"}
	for start := 0; start < events; start += CopyBatch {
		rows := make([][]any, 0, min(CopyBatch, events-start))
		for i := start; i < min(start+CopyBatch, events); i++ {
			stream := StreamID(i % streams)
			// The id as [16]byte, which pgx encodes natively (uuid.UUID would go through text).
			rows = append(rows, []any{[16]byte(uuid.Must(uuid.NewV7())), stream, int64(i/streams + 1), typeFunc(i), payloadFunc(stream, i)})
		}
		n, err := pool.CopyFrom(ctx, pgx.Identifier{"nudge_events"}, columns, pgx.CopyFromRows(rows))
		require.NoError(tb, err)
		require.EqualValues(tb, len(rows), n)
	}
	// Keep nudge_streams consistent with the events, as appends would have left it.
	_, err := pool.Exec(ctx, `INSERT INTO nudge_streams (stream_id, version, last_transaction_id)
		SELECT DISTINCT ON (stream_id) stream_id, stream_version, transaction_id
		FROM nudge_events ORDER BY stream_id, stream_version DESC`)
	require.NoError(tb, err)
	// Give the planner statistics, as autovacuum would in a store that has been running.
	_, err = pool.Exec(ctx, `ANALYZE nudge_events, nudge_streams`)
	require.NoError(tb, err)

	var last eventstore.Position
	err = pool.QueryRow(ctx, `SELECT transaction_id, global_position FROM nudge_events
		ORDER BY transaction_id DESC, global_position DESC LIMIT 1`).Scan(&last.TransactionID, &last.GlobalPosition)
	require.NoError(tb, err)
	return last
}
