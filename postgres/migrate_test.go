package postgres_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/postgres"
)

// step is a row of nudge_schema_migrations.
type step struct {
	Component string
	Version   int
	Name      string
	AppliedAt time.Time
}

// legacySteps are the rows each component's own migrator wrote before the driver core
// existed (read from a database migrated by that code): a database migrated then must find
// nothing to do now, so these names and versions never change. New migrations only add rows.
var legacySteps = []step{
	{Component: "eventstore", Version: 1, Name: "create_events"},
	{Component: "eventstore", Version: 2, Name: "add_event_type_index"},
	{Component: "projection", Version: 1, Name: "create_projections"},
	{Component: "projection", Version: 2, Name: "create_projection_skips"},
	{Component: "projection", Version: 3, Name: "add_crash_loop_tracking"},
	{Component: "projection", Version: 4, Name: "add_projection_event_types"},
	{Component: "deadletter", Version: 1, Name: "create_dead_letters"},
	{Component: "channel", Version: 1, Name: "create_channel_tables"},
}

// newSteps are the migrations added since: a legacy database runs them at its next Migrate.
var newSteps = []step{
	{Component: "eventstore", Version: 3, Name: "notify_appends"},
	{Component: "deadletter", Version: 2, Name: "add_dead_letter_stream"},
	{Component: "channel", Version: 2, Name: "drop_channel_dead_letters"},
	{Component: "projection", Version: 5, Name: "create_parked_streams"},
	{Component: "channel", Version: 3, Name: "notify_triggers"},
	{Component: "projection", Version: 6, Name: "create_partition_leases"},
	{Component: "projection", Version: 7, Name: "create_projection_versions"},
	{Component: "projection", Version: 8, Name: "add_projection_partitions"},
	{Component: "projection", Version: 9, Name: "add_projection_state_changes"},
}

// allSteps are every component's migrations, in the order of postgres.Components, then by
// version.
var allSteps = slices.Concat(legacySteps[:2], newSteps[:1], legacySteps[2:6], newSteps[3:4], newSteps[5:8], newSteps[8:9], legacySteps[6:7], newSteps[1:2], legacySteps[7:], newSteps[2:3], newSteps[4:5])

// stepsOf returns the steps of allSteps that belong to components, in allSteps' order.
func stepsOf(components ...string) []step {
	var steps []step
	for _, s := range allSteps {
		if slices.Contains(components, s.Component) {
			steps = append(steps, s)
		}
	}
	return steps
}

// allTables are the tables and views Migrate creates with every component.
var allTables = []string{"nudge_channel_subscriptions", "nudge_channel_triggers", "nudge_dead_letters",
	"nudge_events", "nudge_partition_leases", "nudge_partition_members", "nudge_projection_conditions", "nudge_projection_park_actions", "nudge_projection_parked", "nudge_projection_skips", "nudge_projection_versions", "nudge_projections", "nudge_schema_migrations", "nudge_streams"}

// recorded returns the rows of nudge_schema_migrations in schema, in the order of
// postgres.Components, then by version.
func recorded(t *testing.T, db *pgtest.DB, schema string) []step {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT component, version, name, applied_at FROM `+table(schema, "nudge_schema_migrations")+`
		ORDER BY array_position($1::text[], component), version`, postgres.Components())
	require.NoError(t, err)
	steps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[step])
	require.NoError(t, err)
	return steps
}

// withoutTimes returns steps with AppliedAt cleared.
func withoutTimes(steps []step) []step {
	out := make([]step, len(steps))
	for i, s := range steps {
		s.AppliedAt = time.Time{}
		out[i] = s
	}
	return out
}

// tables returns the tables and views in schema ("" for the search path's), by name.
func tables(t *testing.T, db *pgtest.DB, schema string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT table_name::text FROM information_schema.tables
		WHERE table_schema = coalesce(nullif($1, ''), current_schema()) ORDER BY 1`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func table(schema, name string) string {
	if schema == "" {
		return name
	}
	return schema + "." + name
}

// TestMigrateTwice: Migrate without components creates every component's tables and records
// the steps the components always recorded; a second run changes nothing.
func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "nudge"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			require.NoError(t, postgres.Migrate(ctx, db.Pool, schema))
			first := recorded(t, db, schema)
			require.Equal(t, allSteps, withoutTimes(first))
			require.Equal(t, allTables, tables(t, db, schema))

			require.NoError(t, postgres.Migrate(ctx, db.Pool, schema), "a second run finds nothing to do")
			require.Equal(t, first, recorded(t, db, schema), "nothing ran again")
			require.Equal(t, allTables, tables(t, db, schema))
		})
	}
}

// TestMigrateOneComponentThenAll: a component migrated alone gets its tables only; migrating
// everything later adds the others. The view nudge_projection_conditions comes as soon as the
// tables of both the events and the projections exist, whichever came first.
func TestMigrateOneComponentThenAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, postgres.Migrate(ctx, db.Pool, "", postgres.ComponentDeadLetters))
	require.Equal(t, stepsOf("deadletter"), withoutTimes(recorded(t, db, "")))
	require.Equal(t, []string{"nudge_dead_letters", "nudge_schema_migrations"}, tables(t, db, ""))

	require.NoError(t, postgres.Migrate(ctx, db.Pool, "", postgres.ComponentProjections))
	require.Equal(t, []string{"nudge_dead_letters", "nudge_partition_leases", "nudge_partition_members", "nudge_projection_park_actions", "nudge_projection_parked", "nudge_projection_skips", "nudge_projection_versions", "nudge_projections", "nudge_schema_migrations"}, tables(t, db, ""),
		"no view without the events table")
	require.NoError(t, postgres.Migrate(ctx, db.Pool, "", postgres.ComponentEvents))
	require.Contains(t, tables(t, db, ""), "nudge_projection_conditions")

	before := recorded(t, db, "")
	require.NoError(t, postgres.Migrate(ctx, db.Pool, ""))
	after := recorded(t, db, "")
	require.Equal(t, allSteps, withoutTimes(after))
	require.Equal(t, before, after[:len(before)], "the components migrated before are not migrated again")
	require.Equal(t, allTables, tables(t, db, ""))
}

// TestMigrateTakesComponentsInAnyOrder: components run in dependency order, each once,
// whatever order and repetitions the caller gives.
func TestMigrateTakesComponentsInAnyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, postgres.Migrate(ctx, db.Pool, "nudge", postgres.ComponentProjections, postgres.ComponentEvents, postgres.ComponentProjections))
	require.Equal(t, stepsOf("eventstore", "projection"), withoutTimes(recorded(t, db, "nudge")))
	require.Equal(t, []string{"nudge_events", "nudge_partition_leases", "nudge_partition_members", "nudge_projection_conditions", "nudge_projection_park_actions", "nudge_projection_parked", "nudge_projection_skips", "nudge_projection_versions", "nudge_projections",
		"nudge_schema_migrations", "nudge_streams"}, tables(t, db, "nudge"))
}

// TestMigrateConcurrently: processes starting at once all migrate; each succeeds and every
// step runs once. Each migrator has a connection of its own.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "nudge"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			const n = 2
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				pool := db.NewPool(t, 1)
				wg.Go(func() {
					<-start
					errs[i] = postgres.Migrate(context.Background(), pool, schema)
				})
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, allSteps, withoutTimes(recorded(t, db, schema)))
			require.Equal(t, allTables, tables(t, db, schema))
		})
	}
}

// TestMigrateLegacyDatabase: a database that the components' own migrators migrated before
// the driver core existed — their tables created, their steps recorded — migrates again with
// only the migrations added since to do (newSteps). (Running any legacy step again would fail:
// its CREATE TABLE finds the table.) Rows written before keep their data, except the channel's
// dead-letter table, which goes with what it held.
func TestMigrateLegacyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	// What the old migrator did, step by step, in the search path's schema.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE nudge_schema_migrations (
		component  text        NOT NULL,
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, version)
	)`)
	require.NoError(t, err)
	then := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, s := range legacySteps {
		sql, err := fs.ReadFile(os.DirFS("migrations"), fmt.Sprintf("%s/%04d_%s.sql", s.Component, s.Version, s.Name))
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, string(sql))
		require.NoError(t, err, "%s %d", s.Component, s.Version)
		_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_schema_migrations (component, version, name, applied_at) VALUES ($1, $2, $3, $4)`,
			s.Component, s.Version, s.Name, then)
		require.NoError(t, err)
	}
	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_dead_letters (projection, message_uuid, payload, error,
		failing_event_id, failing_event_type, attempts, first_failed_at, last_failed_at)
		VALUES ('tickets', 'm-1', '', 'boom', gen_random_uuid(), 'TicketWasRegistered', 1, now(), now())`)
	require.NoError(t, err)
	before := recorded(t, db, "")

	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_channel_dead_letters (uuid, payload) VALUES ('dead-1', 'poison')`)
	require.NoError(t, err, "a dead letter the channel kept before it had no dead-letter topic")

	require.NoError(t, postgres.Migrate(ctx, db.Pool, ""))
	after := recorded(t, db, "")
	require.Equal(t, allSteps, withoutTimes(after), "only the migrations added since ran")
	isNew := func(s step) bool {
		return slices.Contains(newSteps, step{Component: s.Component, Version: s.Version, Name: s.Name})
	}
	require.Equal(t, before, slices.DeleteFunc(after, isNew), "no legacy step ran again")
	require.Equal(t, allTables, tables(t, db, ""), "the view is replaced (it had no version mark); the channel's dead-letter table is gone")
	var stream *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT failing_stream_id FROM nudge_dead_letters WHERE message_uuid = 'm-1'`).Scan(&stream))
	require.Nil(t, stream, "a dead letter from before has no stream")
}

// TestMigrateTxIsTheCallersTransaction: MigrateTx's work is undone with the caller's
// transaction, and leaves its search_path as it was.
func TestMigrateTxIsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	// A failing assertion below must not leave the transaction holding its connection: the
	// pool's cleanup would wait for it for ever.
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var before, after string
	require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&before))
	require.NoError(t, postgres.MigrateTx(ctx, tx, "nudge"))
	require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&after))
	require.Equal(t, before, after)
	require.NoError(t, tx.Rollback(ctx))
	var schemas int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'nudge'`).Scan(&schemas))
	require.Zero(t, schemas, "rolled back with the caller's transaction")
}

// TestMigrateRefusesBadArguments: what Migrate cannot do is refused before the database is
// touched, with what to do instead.
func TestMigrateRefusesBadArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.ErrorIs(t, postgres.Migrate(ctx, db.Pool, "Nudge"), postgres.ErrInvalidSchema)
	require.ErrorIs(t, postgres.MigrateTx(ctx, struct{ pgx.Tx }{}, "1x"), postgres.ErrInvalidSchema)
	err := postgres.Migrate(ctx, db.Pool, "", postgres.ComponentEvents, "events")
	require.ErrorContains(t, err, `unknown component "events"`)
	require.ErrorContains(t, err, `"eventstore" "projection" "deadletter" "channel"`)
	require.ErrorContains(t, postgres.Migrate(ctx, nil, ""), "*pgxpool.Pool")
	require.ErrorContains(t, postgres.MigrateTx(ctx, nil, ""), "use Migrate")
	require.Empty(t, tables(t, db, ""), "nothing was created")
}

func TestComponents(t *testing.T) {
	t.Parallel()
	require.Equal(t, []postgres.Component{postgres.ComponentEvents, postgres.ComponentProjections, postgres.ComponentDeadLetters, postgres.ComponentQueue},
		postgres.Components())
	entries, err := os.ReadDir("migrations")
	require.NoError(t, err)
	var dirs []postgres.Component
	for _, e := range entries {
		dirs = append(dirs, postgres.Component(e.Name()))
	}
	require.ElementsMatch(t, postgres.Components(), dirs, "one migrations directory per component")
}

// TestMigrateAsLeastPrivilegeRole: a role that may only read and write nudge's tables
// (pgtest.LeastPrivilegeGrants, as a least-privilege deploy grants them) runs Migrate at every
// start: once the owner has migrated, it finds nothing to do and changes no schema.
func TestMigrateAsLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "nudge"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			require.NoError(t, postgres.Migrate(ctx, db.Pool, schema), "the owner migrates")
			before := recorded(t, db, schema)
			role := db.LeastPrivilegePool(t, schema)
			require.NoError(t, postgres.Migrate(ctx, role, schema), "nothing to migrate: no DDL")
			require.NoError(t, postgres.Migrate(ctx, role, schema, postgres.ComponentProjections))
			require.Equal(t, before, recorded(t, db, schema))
			require.Equal(t, allTables, tables(t, db, schema))
		})
	}
}

// TestMigrateWithoutPrivilege: when there is something to migrate and the role may not, Migrate
// fails with a *postgres.PrivilegeError (errors.Is postgres.ErrPrivilege) that says what to do,
// and changes nothing: on a database never migrated, and when the view
// nudge_projection_conditions of an older version must be replaced.
func TestMigrateWithoutPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	role := db.LeastPrivilegePool(t, "")
	err := postgres.Migrate(ctx, role, "")
	require.ErrorIs(t, err, postgres.ErrPrivilege)
	var perr *postgres.PrivilegeError
	require.ErrorAs(t, err, &perr)
	require.Contains(t, perr.Role, "nudge_test_role_")
	require.ErrorContains(t, err, "run Migrate once as the role that owns nudge's tables")
	require.Empty(t, tables(t, db, ""), "nothing was created")

	require.NoError(t, postgres.Migrate(ctx, db.Pool, ""), "the owner migrates")
	role = db.LeastPrivilegePool(t, "")
	require.NoError(t, postgres.Migrate(ctx, role, ""))
	// The view as an older version left it: another definition, with no mark of its version.
	_, err = db.Pool.Exec(ctx, `CREATE OR REPLACE VIEW nudge_projection_conditions AS SELECT p.name, 'caught_up'::text AS condition,
		p.state, p.transaction_id, p.global_position, p.updated_at FROM nudge_projections p;
		COMMENT ON VIEW nudge_projection_conditions IS NULL`)
	require.NoError(t, err)
	err = postgres.Migrate(ctx, role, "")
	require.ErrorIs(t, err, postgres.ErrPrivilege)
	require.ErrorContains(t, err, "nudge_projection_conditions")
	require.NoError(t, postgres.Migrate(ctx, db.Pool, ""), "the owner replaces it")
	require.NoError(t, postgres.Migrate(ctx, role, ""), "and the role finds nothing to do again")
}
