package pgmigrate_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgmigrate"
)

func TestMissing(t *testing.T) {
	t.Parallel()
	undefined := func(msg string) error {
		return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42P01", Message: msg})
	}
	tables := []string{"nudge_events", "nudge_streams"}
	require.True(t, pgmigrate.Missing(undefined(`relation "nudge_events" does not exist`), "", tables...))
	require.True(t, pgmigrate.Missing(undefined(`relation "events.nudge_streams" does not exist`), "", tables...))
	require.True(t, pgmigrate.Missing(undefined(`Relation »nudge_events« existiert nicht`), "", tables...), "any message language")
	require.False(t, pgmigrate.Missing(undefined(`relation "nudge_events_archive" does not exist`), "", tables...), "a user's table")
	require.False(t, pgmigrate.Missing(undefined(`relation "my_nudge_events" does not exist`), "", tables...))
	require.False(t, pgmigrate.Missing(undefined(`relation "tickets" does not exist`), "", tables...))
	require.False(t, pgmigrate.Missing(&pgconn.PgError{Code: "42P07", Message: `relation "nudge_events" already exists`}, "", tables...))
	require.False(t, pgmigrate.Missing(errors.New(`relation "nudge_events" does not exist`), "", tables...))
	require.False(t, pgmigrate.Missing(nil, "", tables...))

	noSchema := &pgconn.PgError{Code: "3F000", Message: `schema "events" does not exist`}
	require.True(t, pgmigrate.Missing(noSchema, "events", tables...), "the component's own schema")
	require.False(t, pgmigrate.Missing(noSchema, "", tables...), "another schema than the component's")
	require.False(t, pgmigrate.Missing(noSchema, "event", tables...))
}
