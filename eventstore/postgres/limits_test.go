package postgres_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
)

// noSQL is a database handle that fails the test on any use.
type noSQL struct{ t *testing.T }

func (n noSQL) Begin(context.Context) (pgx.Tx, error) {
	n.t.Error("Begin called")
	return nil, context.Canceled
}

func (n noSQL) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	n.t.Error("BeginTx called")
	return nil, context.Canceled
}

func (n noSQL) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	n.t.Errorf("Exec called: %s", sql)
	return pgconn.CommandTag{}, context.Canceled
}

func (n noSQL) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	n.t.Errorf("Query called: %s", sql)
	return nil, context.Canceled
}

func (n noSQL) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	n.t.Errorf("QueryRow called: %s", sql)
	return nil
}

func (n noSQL) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	n.t.Error("SendBatch called")
	return nil
}

// noSQLTx is a transaction whose every method panics (the embedded interface is nil).
type noSQLTx struct{ pgx.Tx }

// TestTooLargeSendsNoSQL: an append beyond the limits is refused before the store begins a
// transaction or sends a statement, through Append and AppendTx alike.
func TestTooLargeSendsNoSQL(t *testing.T) {
	t.Parallel()
	s, err := postgres.New(noSQL{t}, postgres.Config{Limits: eventstore.Limits{MaxEventBytes: 1000}})
	require.NoError(t, err)
	require.Equal(t, eventstore.Limits{MaxEventBytes: 1000, MaxAppendBytes: 16 << 20, MaxAppendEvents: 10_000}, s.Limits())
	ctx := context.Background()
	big := eventstore.EventData{Type: "A", Payload: json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)}

	_, err = s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1), big)
	require.ErrorIs(t, err, eventstore.ErrTooLarge)
	_, err = s.AppendTx(ctx, noSQLTx{}, "s", eventstore.Any, big)
	require.ErrorIs(t, err, eventstore.ErrTooLarge)

	many := make([]eventstore.EventData, eventstore.MaxAppendEventsDefault+1)
	for i := range many {
		many[i] = storetest.Event("A", i)
	}
	_, err = s.AppendTx(ctx, noSQLTx{}, "s", eventstore.Any, many...)
	require.ErrorIs(t, err, eventstore.ErrTooLarge)
}

func TestNewRefusesBadLimits(t *testing.T) {
	t.Parallel()
	_, err := postgres.New(noSQL{t}, postgres.Config{Limits: eventstore.Limits{MaxAppendEvents: -1}})
	require.ErrorIs(t, err, postgres.ErrInvalidConfig)
	require.ErrorIs(t, err, eventstore.ErrInvalidInput) // the *ValidationError inside
	require.ErrorContains(t, err, "Limits.MaxAppendEvents: -1")
	_, err = postgres.New(noSQL{t}, postgres.Config{Limits: eventstore.Limits{MaxEventBytes: 2 << 20, MaxAppendBytes: 1 << 20}})
	require.ErrorContains(t, err, "could never be appended")
}
