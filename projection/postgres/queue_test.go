package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// TestQueuedHandlers: OnQueued handlers write a read model through one round trip per batch;
// a statement that fails is charged to the event that queued it, the events before it commit,
// and after the fix every event is applied exactly once. An On handler in the same projection
// sees what earlier events queued.
func TestQueuedHandlers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var positions []eventstore.Position
	for s := range 10 {
		var batch []eventstore.EventData
		for n := s*30 + 1; n <= s*30+30; n++ {
			label := "ok"
			if n == 137 {
				label = strings.Repeat("x", 30) // too long for the read model's column
			}
			data, err := eventstore.NewEventData("Registered", registered{N: n, Label: label})
			require.NoError(t, err)
			batch = append(batch, data)
		}
		if s == 9 {
			// The last stream also counts its events with an On handler, which reads the rows the
			// queued handler wrote for earlier events of the same batch.
			batch = append(batch, storetest.Event("Counted", 0))
		}
		res, err := e.store.Append(ctx, fmt.Sprintf("q-%d", s), eventstore.NoStream, batch...)
		require.NoError(t, err)
		for _, ev := range res.Events {
			positions = append(positions, ev.Position)
		}
	}
	storetest.Settle(t, e.store, positions[len(positions)-1])

	p, err := projection.New("queued_list", projection.Config{
		BatchSize: 50,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS queued_list (n int PRIMARY KEY, label varchar(25) NOT NULL, times int NOT NULL);
				CREATE TABLE IF NOT EXISTS queued_count (rows int NOT NULL)`)
			return err
		},
	},
		projection.OnQueued("Registered", func(_ context.Context, q *projection.Queue, ev projection.Event[registered]) error {
			q.Queue(`INSERT INTO queued_list (n, label, times) VALUES ($1, $2, 1)
				ON CONFLICT (n) DO UPDATE SET times = queued_list.times + 1`, ev.Data.N, ev.Data.Label)
			return nil
		}),
		projection.On("Counted", func(ctx context.Context, tx pgx.Tx, _ projection.Event[projectiontest.Payload]) error {
			_, err := tx.Exec(ctx, `INSERT INTO queued_count SELECT count(*) FROM queued_list`)
			return err
		}))
	require.NoError(t, err)
	r := runner(t, e.backend, p)

	res, err := r.CatchUp(ctx, "queued_list")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorContains(t, err, "value too long")
	var he *projection.HandlerError
	require.ErrorAs(t, err, &he)
	require.Equal(t, positions[136], he.Event.Position, "the failure names the event whose statement failed")
	require.Equal(t, 136, res.Events, "the events before it are committed")
	require.Equal(t, []string{"136"}, dumpTable(t, e.db.Pool, `SELECT count(*) FROM queued_list`))
	st, err := r.Status(ctx, "queued_list")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, positions[135], st.Position)

	_, err = e.db.Pool.Exec(ctx, `ALTER TABLE queued_list ALTER COLUMN label TYPE varchar(100)`)
	require.NoError(t, err)
	res, err = r.CatchUp(ctx, "queued_list")
	require.NoError(t, err)
	require.Equal(t, 165, res.Events)
	require.Equal(t, []string{"300 0"}, dumpTable(t, e.db.Pool, `SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM queued_list`),
		"every event applied exactly once")
	require.Equal(t, []string{"300"}, dumpTable(t, e.db.Pool, `SELECT rows FROM queued_count`),
		"the On handler saw the rows queued before it in its batch")
}

// TestQueuedHandlerInline: inline, a queued handler's statements run at once in the append's
// transaction, and their failure fails the append.
func TestQueuedHandlerInline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.db.Pool.Exec(ctx, `CREATE TABLE inline_queued (n int PRIMARY KEY CHECK (n >= 0))`)
	require.NoError(t, err)
	p := mustNew(t, "inline-queued", projection.OnQueued("A", func(_ context.Context, q *projection.Queue, ev projection.Event[projectiontest.Payload]) error {
		q.Queue(`INSERT INTO inline_queued VALUES ($1)`, ev.Data.N)
		return nil
	}))
	in, err := postgres.NewInline(e.store, p)
	require.NoError(t, err)
	_, err = in.Append(ctx, "s", eventstore.NoStream, storetest.Event("A", 1), storetest.Event("A", 2))
	require.NoError(t, err)
	_, err = in.Append(ctx, "s", eventstore.Exact(2), storetest.Event("A", 3), storetest.Event("A", -1))
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorContains(t, err, "check constraint")
	require.Equal(t, []string{"1", "2"}, dumpTable(t, e.db.Pool, `SELECT n FROM inline_queued ORDER BY n`))
}
