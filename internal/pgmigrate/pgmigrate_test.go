package pgmigrate_test

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgmigrate"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"m/0002_second.sql": {Data: []byte("SELECT 2")},
		"m/0001_first.sql":  {Data: []byte("SELECT 1")},
	}
	migs, err := pgmigrate.Load(fsys, "m")
	require.NoError(t, err)
	require.Equal(t, []pgmigrate.Migration{{Version: 1, Name: "first", SQL: "SELECT 1"}, {Version: 2, Name: "second", SQL: "SELECT 2"}}, migs)
}

func TestLoadRefusesBadSets(t *testing.T) {
	t.Parallel()
	for name, fsys := range map[string]fstest.MapFS{
		"file name must look like": {"m/1_first.sql": {}},
		"0002 is missing":          {"m/0001_a.sql": {}, "m/0003_c.sql": {}},
		"0001 is missing":          {"m/0002_b.sql": {}},
		"0002 is missing or":       {"m/0001_a.sql": {}, "m/0001_b.sql": {}},
	} {
		_, err := pgmigrate.Load(fsys, "m")
		require.ErrorContains(t, err, name)
	}
	_, err := pgmigrate.Load(fstest.MapFS{}, "none")
	require.Error(t, err)
}
