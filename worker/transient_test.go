package worker_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/worker"
)

func TestTransientCause(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]string{
		"40001": "sqlstate 40001", "40P01": "sqlstate 40P01", "55P03": "sqlstate 55P03", "57014": "sqlstate 57014",
		"08006": "sqlstate 08006", "57P01": "sqlstate 57P01", "53300": "sqlstate 53300", "25P03": "sqlstate 25P03",
		"22001": "", "23505": "", "42P01": "",
	} {
		err := fmt.Errorf("handler: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, worker.TransientCause(err), code)
	}
	require.Empty(t, worker.TransientCause(errors.New("a bug")))
}
