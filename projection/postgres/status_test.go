package postgres_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

func ignore(context.Context, projection.Event[json.RawMessage]) error { return nil }

// storedTypes reads the event types Register recorded for name.
func (e env) storedTypes(t *testing.T, name string) []string {
	t.Helper()
	var types []string
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT event_types FROM nudge_projections WHERE name = $1`, name).Scan(&types))
	return types
}

// TestStatusOfWithoutDefinition: Register records each projection's event types, so StatusOf
// and Statuses compute the same status and lag as Runner.Status from the name alone.
func TestStatusOfWithoutDefinition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	typed, err := projection.New("typed", projection.Config{}, projection.OnIdempotent("B", ignore), projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	anyType, err := projection.New("every", projection.Config{}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	r := runner(t, e.backend, typed, anyType)
	require.Equal(t, []string{"A", "B"}, e.storedTypes(t, "typed"))
	require.Nil(t, e.storedTypes(t, "every"), "NULL: every type")

	res, err := e.store.Append(ctx, "s", eventstore.Any,
		eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "C", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "B", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "C", Payload: json.RawMessage(`{}`)},
	)
	require.NoError(t, err)
	storetest.Settle(t, e.store, res.Last())

	for name, lag := range map[string]int64{"typed": 2, "every": 4} {
		both := unheld(t, func() ([]projection.Status, error) {
			want, err := r.Status(ctx, name)
			if err != nil {
				return nil, err
			}
			got, err := e.backend.StatusOf(ctx, name)
			return []projection.Status{want, got}, err
		})
		want, got := both[0], both[1]
		require.Equal(t, lag, got.LagEvents, name)
		require.Equal(t, want.LagEvents, got.LagEvents, name)
		require.Equal(t, want.Head, got.Head, name)
		require.Equal(t, res.Last(), got.Head, name)
		require.Equal(t, want.State, got.State, name)
		require.Positive(t, got.LagTime, name)
	}

	all := unheld(t, func() ([]projection.Status, error) { return e.backend.Statuses(ctx) })
	require.Len(t, all, 2)
	require.Equal(t, "every", all[0].Name, "sorted by name")
	require.Equal(t, int64(4), all[0].LagEvents)
	require.Equal(t, "typed", all[1].Name)
	require.Equal(t, int64(2), all[1].LagEvents)

	// Caught up: no lag, by name too.
	_, err = r.CatchUp(ctx, "typed")
	require.NoError(t, err)
	st, err := e.backend.StatusOf(ctx, "typed")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)
	require.Zero(t, st.LagTime)
	require.Equal(t, int64(2), st.EventsProcessed)

	// A row from before the types were recorded counts every type until the next Init.
	_, err = e.db.Pool.Exec(ctx, `UPDATE nudge_projections SET event_types = NULL WHERE name = 'typed'`)
	require.NoError(t, err)
	st = unheld(t, func() ([]projection.Status, error) {
		st, err := e.backend.StatusOf(ctx, "typed")
		return []projection.Status{st}, err
	})[0]
	require.Equal(t, int64(1), st.LagEvents, "the C after the position counts while the types are unknown")
	require.NoError(t, r.Init(ctx))
	require.Equal(t, []string{"A", "B"}, e.storedTypes(t, "typed"))
	st, err = e.backend.StatusOf(ctx, "typed")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)

	// A definition that changes its types rewrites them at its next Init.
	narrower, err := projection.New("typed", projection.Config{}, projection.OnIdempotent("C", ignore))
	require.NoError(t, err)
	runner(t, e.backend, narrower)
	require.Equal(t, []string{"C"}, e.storedTypes(t, "typed"))

	_, err = e.backend.StatusOf(ctx, "nosuch")
	require.ErrorIs(t, err, projection.ErrNotRegistered)
}

// unheld reads statuses with read until none is held by the horizon: another test's
// transaction anywhere in the cluster may hold it a moment, and a held status counts fewer
// events in its lag.
func unheld(t *testing.T, read func() ([]projection.Status, error)) []projection.Status {
	t.Helper()
	var sts []projection.Status
	require.Eventually(t, func() bool {
		var err error
		sts, err = read()
		require.NoError(t, err)
		return !slices.ContainsFunc(sts, func(st projection.Status) bool { return st.HeldByHorizon })
	}, testwait.For(time.Minute), 10*time.Millisecond, "statuses no transaction of the cluster held")
	return sts
}

// TestStatusesEmpty: no status rows is an empty list, not an error.
func TestStatusesEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	all, err := e.backend.Statuses(context.Background())
	require.NoError(t, err)
	require.Empty(t, all)
}

// TestStatusesAsStatusOf: Statuses reads the horizon, the head and the held check once for all
// projections and every lag in one statement; each status it gives is the one StatusOf gives:
// projections at different positions, of every type or of some, sharing a position and types
// or not, with exact and estimated lags, caught up, and held behind an open transaction (on a
// private cluster, where no other transaction holds the horizon) with the holder named.
func TestStatusesAsStatusOf(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, 2*time.Minute)
	pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))

	positions := projectiontest.AppendN(t, store, 0, 2600, "A", "B", "C", "A")
	storetest.Settle(t, store, positions[len(positions)-1])
	every := []projection.Handler{projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil })}
	typed := func(types ...string) []projection.Handler {
		var hs []projection.Handler
		for _, typ := range types {
			hs = append(hs, projection.OnIdempotent(typ, ignore))
		}
		return hs
	}
	at := map[string]struct {
		handlers []projection.Handler
		after    int // index into positions; -1: from the start
	}{
		"a_start":     {typed("A"), -1}, // more than 1,000 behind: estimated
		"a_start2":    {typed("A"), -1}, // the same position and types as a_start
		"a_mid":       {typed("A"), 1999},
		"ab_start":    {typed("A", "B"), -1},
		"ab_mid":      {typed("B", "A"), 2100},
		"c_near":      {typed("C"), 2590},
		"d_none":      {typed("D"), -1}, // no event of its type
		"every_start": {every, -1},
		"every_mid":   {every, 1800}, // 799 behind: exact
		"every_end":   {every, len(positions) - 1},
	}
	for name, p := range at {
		def, err := projection.New(name, projection.Config{}, p.handlers...)
		require.NoError(t, err)
		require.NoError(t, backend.Register(ctx, def, nil))
		if p.after >= 0 {
			pos := positions[p.after]
			_, err := pool.Exec(ctx, `UPDATE nudge_projections SET transaction_id = $2::text::xid8, global_position = $3 WHERE name = $1`,
				name, strconv.FormatUint(pos.TransactionID, 10), pos.GlobalPosition)
			require.NoError(t, err)
		}
	}

	same := func(held bool) {
		t.Helper()
		all, err := backend.Statuses(ctx)
		require.NoError(t, err)
		require.Len(t, all, len(at))
		for _, got := range all {
			want, err := backend.StatusOf(ctx, got.Name)
			require.NoError(t, err)
			require.Equal(t, want.Position, got.Position, got.Name)
			require.Equal(t, want.Head, got.Head, got.Name)
			require.Equal(t, want.LagEvents, got.LagEvents, got.Name)
			require.Equal(t, want.LagEstimated, got.LagEstimated, got.Name)
			require.Equal(t, want.LagTime == 0, got.LagTime == 0, got.Name)
			require.InDelta(t, want.LagTime.Seconds(), got.LagTime.Seconds(), time.Minute.Seconds(), got.Name)
			require.Equal(t, want.HeldByHorizon, got.HeldByHorizon, got.Name)
			require.Equal(t, want.Holder != nil, got.Holder != nil, got.Name)
			if got.Holder != nil {
				require.Equal(t, want.Holder.TransactionID, got.Holder.TransactionID, got.Name)
			}
			require.Equal(t, held && got.Name != "d_none", got.HeldByHorizon, got.Name)
		}
		byName := map[string]projection.Status{}
		for _, st := range all {
			byName[st.Name] = st
		}
		require.True(t, byName["a_start"].LagEstimated)
		require.Equal(t, byName["a_start"].LagEvents, byName["a_start2"].LagEvents)
		require.False(t, byName["every_mid"].LagEstimated)
		require.Equal(t, int64(799), byName["every_mid"].LagEvents)
		require.Zero(t, byName["every_end"].LagEvents)
		require.Zero(t, byName["d_none"].LagEvents)
		require.Zero(t, byName["d_none"].LagTime)
		require.Positive(t, byName["c_near"].LagEvents)
	}
	same(false)

	// An open transaction holds back an event of each type: every projection but d_none is held.
	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	_, err = open.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	_, err = store.Append(ctx, "late", eventstore.Any, storetest.Event("A", 1), storetest.Event("B", 2), storetest.Event("C", 3))
	require.NoError(t, err)
	same(true)
}

// TestStatusesOfDefinitions: StatusesOf computes, in one call, what Status computes for each
// definition — the lag of its own types, whatever the row recorded — and Runner.StatusesOf
// gives the same, in the order asked.
func TestStatusesOfDefinitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	typed, err := projection.New("typed", projection.Config{}, projection.OnIdempotent("B", ignore), projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	anyType, err := projection.New("every", projection.Config{}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	r := runner(t, e.backend, typed, anyType)
	res, err := e.store.Append(ctx, "s", eventstore.Any,
		eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "C", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "B", Payload: json.RawMessage(`{}`)},
	)
	require.NoError(t, err)
	storetest.Settle(t, e.store, res.Last())
	_, err = r.CatchUp(ctx, "every")
	require.NoError(t, err)
	// The row records every type; the definition's types count.
	_, err = e.db.Pool.Exec(ctx, `UPDATE nudge_projections SET event_types = NULL WHERE name = 'typed'`)
	require.NoError(t, err)

	// The horizon is the cluster's: a transaction of another database (another test's) that
	// ends while one status is read holds every reader back for that moment (pghorizon's
	// commit window), so two reads moments apart may see different heads. The two calls are
	// compared on a read where neither was held.
	var got []projection.Status
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		got, err = e.backend.StatusesOf(ctx, []*projection.Projection{typed, anyType})
		require.NoError(c, err)
		require.Len(c, got, 2)
		for i, p := range []*projection.Projection{typed, anyType} {
			want, err := e.backend.Status(ctx, p)
			require.NoError(c, err)
			require.Equal(c, want.Name, got[i].Name)
			require.Equal(c, want.LagEvents, got[i].LagEvents, p.Name())
			require.Equal(c, want.Position, got[i].Position, p.Name())
			require.Equal(c, want.Head, got[i].Head, p.Name())
			require.Equal(c, want.State, got[i].State, p.Name())
		}
		require.Equal(c, res.Last(), got[1].Head, "every: the head is the last event")
	}, testwait.For(time.Minute), 10*time.Millisecond)
	require.Equal(t, int64(2), got[0].LagEvents, "typed: A and B, not C")
	require.Zero(t, got[1].LagEvents, "every: caught up")

	viaRunner, err := r.StatusesOf(ctx, "every", "typed")
	require.NoError(t, err)
	require.Equal(t, "every", viaRunner[0].Name)
	require.Equal(t, int64(2), viaRunner[1].LagEvents)

	other, err := projection.New("unregistered", projection.Config{}, projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	_, err = e.backend.StatusesOf(ctx, []*projection.Projection{other})
	require.ErrorIs(t, err, projection.ErrNotRegistered)
}
