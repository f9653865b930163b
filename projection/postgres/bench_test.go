package postgres_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/projection"
)

// BenchmarkCatchUp rebuilds a read model in PostgreSQL from a store of benchEvents events: a
// projection ("nudge", one batch a transaction, at several batch sizes) beside the loop users
// write without the library ("naive", one transaction an event), so the difference is what the
// batching buys.

const (
	// benchEventType is the type of every benchmark event.
	benchEventType = "TicketWasRegistered"
	// benchEvents and benchStreams size the store the projection catches up from.
	benchEvents  = 100_000
	benchStreams = 10_000
	// benchNaiveEvents is how many events the naive baseline handles an iteration: it is slow.
	benchNaiveEvents = 20_000
)

// benchTicketWasRegistered is the payload of the benchmark events.
type benchTicketWasRegistered struct {
	TicketID string  `json:"ticket_id"`
	Customer string  `json:"customer"`
	Price    float64 `json:"price"`
}

// The read models: one table the projection writes, one the naive baseline writes, with the
// same upsert (a later version of a ticket replaces an earlier one).
const (
	benchCreateTicketListSQL = `CREATE TABLE IF NOT EXISTS ticket_list (
		ticket_id text PRIMARY KEY, customer text NOT NULL, price numeric NOT NULL, version bigint NOT NULL)`
	benchUpsertTicketSQL = `INSERT INTO ticket_list (ticket_id, customer, price, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE ticket_list.version < EXCLUDED.version`
	benchCreateNaiveSQL = `CREATE TABLE ticket_list_naive (
			ticket_id text PRIMARY KEY, customer text NOT NULL, price numeric NOT NULL, version bigint NOT NULL);
		CREATE TABLE naive_position (transaction_id xid8 NOT NULL, global_position bigint NOT NULL);
		INSERT INTO naive_position VALUES ('0', 0)`
	benchResetNaiveSQL = `TRUNCATE ticket_list_naive;
		UPDATE naive_position SET transaction_id = '0', global_position = 0`
	benchUpsertNaiveSQL = `INSERT INTO ticket_list_naive (ticket_id, customer, price, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (ticket_id) DO UPDATE SET customer = EXCLUDED.customer, price = EXCLUDED.price, version = EXCLUDED.version
		WHERE ticket_list_naive.version < EXCLUDED.version`
	// benchNaiveReadSQL is the store's read (its horizon included) one event at a time.
	benchNaiveReadSQL = `SELECT transaction_id, global_position, stream_version, payload FROM nudge_events
		WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY transaction_id, global_position LIMIT 1`
	benchNaiveAdvanceSQL = `UPDATE naive_position SET transaction_id = $1, global_position = $2`
)

func BenchmarkCatchUp(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	last := eventload.Load(b, e.db.Pool, benchEvents, benchStreams, benchEventType, benchPayload)
	benchWaitReadable(b, e.store, last)
	_, err := e.db.Pool.Exec(ctx, benchCreateNaiveSQL)
	require.NoError(b, err)

	for _, batch := range []int{100, 500, 1000} {
		for _, queued := range []bool{false, true} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, map[bool]string{false: "nudge", true: "queued"}[queued]), func(b *testing.B) {
				runner, name := benchRunner(b, e, batch, queued)
				b.ReportAllocs()
				benchResetPeakRSS(b)
				var total int
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					require.NoError(b, runner.Reset(ctx, name))
					b.StartTimer()
					res, err := runner.CatchUp(ctx, name)
					require.NoError(b, err)
					require.Equal(b, benchEvents, res.Events)
					total += res.Events
				}
				b.StopTimer()
				require.Equal(b, benchStreams, benchCount(b, e.db.Pool, "ticket_list"))
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "events/s")
				benchReportRSS(b)
			})
		}
	}

	b.Run("naive", func(b *testing.B) {
		b.ReportAllocs()
		benchResetPeakRSS(b)
		var total int
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			_, err := e.db.Pool.Exec(ctx, benchResetNaiveSQL)
			require.NoError(b, err)
			b.StartTimer()
			n, err := benchNaiveCatchUp(ctx, e.db.Pool, benchNaiveEvents)
			require.NoError(b, err)
			require.Equal(b, benchNaiveEvents, n)
			total += n
		}
		b.StopTimer()
		// Events i and i+benchStreams are versions of one ticket.
		require.Equal(b, min(benchNaiveEvents, benchStreams), benchCount(b, e.db.Pool, "ticket_list_naive"))
		b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "events/s")
		benchReportRSS(b)
	})
}

// benchRunner returns an initialised runner of the ticket_list projection with batches of
// batch events, and the projection's name; queued picks an OnQueued handler over an On one.
func benchRunner(tb testing.TB, e env, batch int, queued bool) (*projection.Runner, string) {
	tb.Helper()
	handler := projection.On(benchEventType, func(ctx context.Context, tx pgx.Tx, e projection.Event[benchTicketWasRegistered]) error {
		_, err := tx.Exec(ctx, benchUpsertTicketSQL, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
		return err
	})
	if queued {
		handler = projection.OnQueued(benchEventType, func(_ context.Context, q *projection.Queue, e projection.Event[benchTicketWasRegistered]) error {
			q.Queue(benchUpsertTicketSQL, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
			return nil
		})
	}
	p, err := projection.New("ticket_list", projection.Config{
		BatchSize: batch,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, benchCreateTicketListSQL)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE ticket_list`)
			return err
		},
	}, handler)
	require.NoError(tb, err)
	// Reset logs at info level every iteration.
	runner, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	require.NoError(tb, err)
	require.NoError(tb, runner.Init(context.Background()))
	return runner, p.Name()
}

// benchNaiveCatchUp handles up to limit events after naive_position the way users write it
// without the library: one transaction per event that reads it, decodes it, upserts the read
// model and moves the position. It returns how many events it handled.
func benchNaiveCatchUp(ctx context.Context, pool *pgxpool.Pool, limit int) (int, error) {
	var after eventstore.Position
	if err := pool.QueryRow(ctx, `SELECT transaction_id, global_position FROM naive_position`).Scan(
		&after.TransactionID, &after.GlobalPosition); err != nil {
		return 0, err
	}
	for n := range limit {
		done, err := benchNaiveHandleOne(ctx, pool, &after)
		if err != nil || done {
			return n, err
		}
	}
	return limit, nil
}

// benchNaiveHandleOne handles the event after *after in a transaction of its own and moves
// *after to it; done is true when there is no event to handle.
func benchNaiveHandleOne(ctx context.Context, pool *pgxpool.Pool, after *eventstore.Position) (done bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // A no-op after Commit.
	var (
		pos     eventstore.Position
		version int64
		payload []byte
		ticket  benchTicketWasRegistered
	)
	err = tx.QueryRow(ctx, benchNaiveReadSQL, after.TransactionID, after.GlobalPosition).Scan(
		&pos.TransactionID, &pos.GlobalPosition, &version, &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(payload, &ticket); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, benchUpsertNaiveSQL, ticket.TicketID, ticket.Customer, ticket.Price, version); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, benchNaiveAdvanceSQL, pos.TransactionID, pos.GlobalPosition); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	*after = pos
	return false, nil
}

// benchWaitReadable waits until the store's head is last: the load is readable once no
// transaction older than it is running anywhere in the cluster.
func benchWaitReadable(tb testing.TB, store *espg.Store, last eventstore.Position) {
	tb.Helper()
	require.EventuallyWithT(tb, func(c *assert.CollectT) {
		head, err := store.Head(context.Background())
		require.NoError(c, err)
		require.Equal(c, last, head)
	}, time.Minute, 10*time.Millisecond, "the loaded events never became readable")
}

// benchPayload is the JSON payload of event i, about 200 bytes.
func benchPayload(ticket string, i int) string {
	return fmt.Sprintf(`{"ticket_id":%q,"customer":"customer-%06d","price":%d.%d,"currency":"EUR",`+
		`"event":"Spring concert, hall B","seat":"row %d seat %d","channel":"web","registered_at":"2024-03-14T09:26:53Z"}`,
		ticket, i%7919, 10+i%90, i%10, 1+i%30, 1+i%40)
}

// benchCount returns the number of rows of table.
func benchCount(tb testing.TB, pool *pgxpool.Pool, table string) int {
	tb.Helper()
	var n int
	require.NoError(tb, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

// benchResetPeakRSS returns freed memory to the system and sets the process's peak RSS back to
// its current RSS, so that the peak reported next belongs to the sub-benchmark. Where the
// kernel does not allow it, the peak stays the process's.
func benchResetPeakRSS(b *testing.B) {
	b.Helper()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS (%v): peak-rss-MB is the process's peak", err)
	}
}

// benchReportRSS reports the peak RSS (since benchResetPeakRSS) and the current RSS.
func benchReportRSS(b *testing.B) {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Logf("no RSS figures: %v", err)
		return
	}
	for sc := bufio.NewScanner(bytes.NewReader(status)); sc.Scan(); {
		key, value, _ := strings.Cut(sc.Text(), ":")
		var unit string
		switch key {
		case "VmHWM":
			unit = "peak-rss-MB"
		case "VmRSS":
			unit = "rss-MB"
		default:
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		require.NoError(b, err, "parse %s in /proc/self/status", key)
		b.ReportMetric(kb/1024, unit)
	}
}

// TestBenchCatchUpBaseline checks that the naive baseline builds the same read model as the
// projection: a baseline that drifted from it would measure something else.
func TestBenchCatchUpBaseline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const events, streams = 2_000, 300
	benchWaitReadable(t, e.store, eventload.Load(t, e.db.Pool, events, streams, benchEventType, benchPayload))
	_, err := e.db.Pool.Exec(ctx, benchCreateNaiveSQL)
	require.NoError(t, err)

	runner, name := benchRunner(t, e, 128, false)
	res, err := runner.CatchUp(ctx, name)
	require.NoError(t, err)
	require.Equal(t, events, res.Events)
	n, err := benchNaiveCatchUp(ctx, e.db.Pool, events+1)
	require.NoError(t, err, "the naive baseline must stop at the end of the store")
	require.Equal(t, events, n)

	rows := func(table string) []string {
		r, err := e.db.Pool.Query(ctx, `SELECT concat_ws('|', ticket_id, customer, price, version) FROM `+
			pgx.Identifier{table}.Sanitize()+` ORDER BY ticket_id`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	want := rows("ticket_list")
	require.Len(t, want, streams)
	require.Equal(t, want, rows("ticket_list_naive"))
	// The last version of every ticket won.
	require.True(t, strings.HasSuffix(want[0], fmt.Sprintf("|%d", (events+streams-1)/streams)), want[0])
}
