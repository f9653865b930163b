package projection_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
)

// TestUnitName: version 1 keeps the projection's name; higher versions get ".vN"; the result
// is a valid name or an error matching name.ErrInvalid.
func TestUnitName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		version int
		want    string
	}{
		{"ticket_list", 1, "ticket_list"},
		{"ticket_list", 2, "ticket_list.v2"},
		{"orders-eu", 12, "orders-eu.v12"},
	} {
		got, err := projection.UnitName(tc.name, tc.version)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
		require.NoError(t, name.Validate(got))
	}
	_, err := projection.UnitName("ticket_list", 0)
	require.ErrorIs(t, err, name.ErrInvalid)
	_, err = projection.UnitName(strings.Repeat("a", name.MaxLength-1), 2)
	require.ErrorIs(t, err, name.ErrInvalid, "the unit name must fit too")
}

// TestVersionedProjection: New derives the unit name and the versioned tables; Version 0 is 1;
// a negative version, a bad table name, a versioned table name PostgreSQL would cut, and a
// table listed twice are refused with ErrInvalidConfig.
func TestVersionedProjection(t *testing.T) {
	t.Parallel()
	p, err := projection.New("ticket_list", projection.Config{Tables: []string{"ticket_list"}}, projection.OnIdempotent("A", noopVersioned))
	require.NoError(t, err)
	require.Equal(t, "ticket_list", p.Name())
	require.Equal(t, "ticket_list", p.Base())
	require.Equal(t, 1, p.Version())
	require.Equal(t, `"ticket_list_v1"`, p.Table("ticket_list"))
	require.Equal(t, projection.RetireGraceDefault, p.Config().RetireGrace)

	p, err = projection.New("ticket_list", projection.Config{Version: 3, Tables: []string{"ticket_list", "ticket_tags"}}, projection.OnIdempotent("A", noopVersioned))
	require.NoError(t, err)
	require.Equal(t, "ticket_list.v3", p.Name())
	require.Equal(t, "ticket_list", p.Base())
	require.Equal(t, `"ticket_tags_v3"`, p.Table("ticket_tags"))
	require.Equal(t, []string{"ticket_list", "ticket_tags"}, p.Tables())
	require.Equal(t, "ticket_list_v3", projection.TableName("ticket_list", 3))

	for _, cfg := range []projection.Config{
		{Version: -1},
		{Tables: []string{"Ticket List"}},
		{Tables: []string{`x"; DROP TABLE y; --`}},
		{Tables: []string{strings.Repeat("t", 61)}},
		{Tables: []string{"a", "a"}},
	} {
		_, err := projection.New("ticket_list", cfg, projection.OnIdempotent("A", noopVersioned))
		require.ErrorIs(t, err, projection.ErrInvalidConfig, "%+v", cfg)
	}
}

// TestVersionStates lists every state once.
func TestVersionStates(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, []projection.VersionState{projection.VersionActive, projection.VersionBuilding, projection.VersionRetired}, projection.VersionStates())
}

// TestReplayingOutsideABuild: a context that no building version handed out is not a replay.
func TestReplayingOutsideABuild(t *testing.T) {
	t.Parallel()
	require.False(t, projection.Replaying(context.Background()))
}

func noopVersioned(context.Context, projection.Event[struct{}]) error { return nil }
