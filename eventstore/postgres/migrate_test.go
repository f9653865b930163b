package postgres_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
)

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	require.NoError(t, s.Migrate(ctx), "a second run finds nothing to do")

	var versions []int
	rows, err := db.Pool.Query(ctx, `SELECT version FROM nudge_schema_migrations WHERE component = 'eventstore' ORDER BY version`)
	require.NoError(t, err)
	versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, versions)
	_, err = s.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "A", Payload: []byte(`{}`)})
	require.NoError(t, err)
}

// TestMigrateConcurrently: processes starting at once all migrate; each one succeeds and the
// schema is created once. Every migrator has a pool (connections) of its own.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "nudge"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			const n = 4
			stores := make([]*postgres.Store, n)
			for i := range n {
				s, err := postgres.New(db.NewPool(t, 1), postgres.Config{Schema: schema})
				require.NoError(t, err)
				stores[i] = s
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			start := make(chan struct{})
			for i, s := range stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = s.Migrate(context.Background())
				}()
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			table := "nudge_schema_migrations"
			if schema != "" {
				table = schema + "." + table
			}
			var count int
			require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&count))
			require.Equal(t, 3, count, "each of the store's three migrations ran once")
		})
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO nudge_schema_migrations (component, version, name) VALUES ('eventstore', 99, 'future')`)
	require.NoError(t, err)
	err = s.Migrate(ctx)
	require.ErrorContains(t, err, "upgrade nudge")
}

func TestMigrateTxKeepsCallerSearchPath(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, postgres.Config{Schema: "events"})
	require.NoError(t, err)
	ctx := context.Background()
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var before, after string
		require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&before))
		if err := s.MigrateTx(ctx, tx); err != nil {
			return err
		}
		require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&after))
		require.Equal(t, before, after)
		return nil
	})
	require.NoError(t, err)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'events' AND tablename LIKE 'nudge_%'`).Scan(&tables))
	require.Equal(t, 3, tables)
}
