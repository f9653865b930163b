package postgres_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
)

// roundTrips counts the round trips of a pool's connections: each batch, and each statement sent
// on its own (a BEGIN or COMMIT of pgx's, say) but the store's notification after a commit,
// which runs in the background.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "pg_notify") {
		r.n.Add(1)
	}
	return ctx
}
func (*roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (*roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestAppendTakesTwoRoundTrips: Append's transaction is two round trips, BEGIN sent with the
// stream's lock and COMMIT with the insert.
func TestAppendTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	_, err = s.Append(ctx, "warm", eventstore.Any, storetest.Event("A", 1)) // the pool's first connection
	require.NoError(t, err)

	before := trips.n.Load()
	_, err = s.Append(ctx, "ticket-1", eventstore.NoStream, storetest.Event("Registered", 1), storetest.Event("Assigned", 2))
	require.NoError(t, err)
	require.Equal(t, before+2, trips.n.Load(), "two round trips")
}

// TestFailedPipelinedAppendCommitsNothing: an insert that fails inside Append's pipeline (here
// a trigger of the test's that refuses one payload) makes the server skip the COMMIT queued
// behind it: nothing of the append is stored, the stream keeps its version, and the connection
// goes back to the pool outside any transaction, so the next append on it works.
func TestFailedPipelinedAppendCommitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pool := db.NewPool(t, 1) // one connection: the next append runs on the failed one's
	s, err := postgres.New(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	_, err = pool.Exec(ctx, `CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.payload ? 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_poison BEFORE INSERT ON nudge_events FOR EACH ROW EXECUTE FUNCTION refuse_poison()`)
	require.NoError(t, err)

	_, err = s.Append(ctx, "ticket-1", eventstore.NoStream, storetest.Event("Registered", 1))
	require.NoError(t, err)
	poison := eventstore.EventData{Type: "Poisoned", Payload: []byte(`{"poison": true}`)}
	_, err = s.Append(ctx, "ticket-1", eventstore.Exact(1), storetest.Event("Assigned", 2), poison)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "poison refused"), err.Error())

	res, err := s.Append(ctx, "ticket-1", eventstore.Exact(1), storetest.Event("Assigned", 2))
	require.NoError(t, err, "the connection came back usable, outside a transaction")
	require.Equal(t, int64(2), res.StreamVersion)
	events, err := s.ReadStream(ctx, "ticket-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 2, "the failed append stored nothing")
	require.Equal(t, "Assigned", events[1].Type)
}
