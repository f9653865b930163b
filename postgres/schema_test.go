package postgres_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/postgres"
)

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "nudge", "_x", "a1", "nudge_ops_2", strings.Repeat("a", 63)} {
		require.NoError(t, postgres.ValidateSchema(schema), schema)
	}
	for _, schema := range []string{"Nudge", "1nudge", "a-b", "a b", "a.b", `x"; DROP SCHEMA public; --`, "é", strings.Repeat("a", 64)} {
		err := postgres.ValidateSchema(schema)
		require.ErrorIs(t, err, postgres.ErrInvalidSchema, schema)
		require.ErrorContains(t, err, "lowercase letters, digits and _", schema)
		require.ErrorContains(t, err, "at most 63", schema)
	}
}
