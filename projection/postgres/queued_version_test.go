package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// lastV2Queued is version 2 of the model with an OnQueued handler and no flush hook, whose
// batches leave their statements to the commit's round trip.
func lastV2Queued(t *testing.T, batchSize int) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	cfg := projection.Config{Version: 2, Tables: []string{lastTable}, BatchSize: batchSize}
	cfg.InitFunc = func(ctx context.Context, hp projection.HookParams) error {
		_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table(lastTable)+` (stream_id text PRIMARY KEY, label text NOT NULL, version bigint NOT NULL)`)
		return err
	}
	p, err := projection.New("stream_last", cfg, projection.OnQueued("Appended", func(_ context.Context, q *projection.Queue, e projection.Event[appended]) error {
		q.Queue(`INSERT INTO `+p.Table(lastTable)+` (stream_id, label, version) VALUES ($1, $2, $3)
			ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version, label = EXCLUDED.label`,
			e.StreamID, fmt.Sprintf("v%d", e.StreamVersion), e.StreamVersion)
		return nil
	}))
	require.NoError(t, err)
	return p
}

// TestQueuedVersionCutOverKeepsEveryStatement: an OnQueued version without a flush hook cuts
// over with several batches of events left after the active version's position — the
// cut-over handles them batch after batch in its one transaction — and its model holds every
// event: the statements of each of those batches were sent, not only the last one's.
func TestQueuedVersionCutOverKeepsEveryStatement(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, time.Minute)
	v1 := lastV1(t, projection.Config{})
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 10, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	appendSettled(ctx, t, e, 11, 40, false) // version 1 stays at 10: 30 events past it

	v2 := lastV2Queued(t, 5)
	r2 := runner(t, e.backend, v2)
	res, err := r2.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated, "version 2 cut over")
	st, err := r2.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, st.VersionState)
	require.EqualValues(t, 40, st.EventsProcessed)

	n, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err, "the stable view shows a whole model")
	require.Equal(t, 40, n, "every event's statement ran, in every batch of the cut-over")
}
