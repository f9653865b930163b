package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
)

type noDB struct{}

func (noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, nil
}

// TestSelectProjectionsByNameWhateverTheVersion: -projections chaos_exact selects the
// exactly-once projection at any version and partition count (its unit name is then
// chaos_exact.v2).
func TestSelectProjectionsByNameWhateverTheVersion(t *testing.T) {
	for _, cfg := range []chaosmodel.Config{{}, {ExactVersion: 1, Partitions: 4}, {ExactVersion: 2, Partitions: 8}} {
		cfg.DB, cfg.SinkPath = noDB{}, filepath.Join(t.TempDir(), "sink")
		m, err := chaosmodel.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		got, err := selectProjections(m.Projections, chaosmodel.ExactProjection)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, chaosmodel.ExactUnit(max(cfg.ExactVersion, 1)), got[0].Name())
		require.Equal(t, max(cfg.Partitions, 1), got[0].Partitions())
		_, err = selectProjections(m.Projections, "chaos_exact.v2")
		require.ErrorContains(t, err, "unknown projection")
	}
}
