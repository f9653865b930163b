package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/projection"
)

// SetStateOf sets the state of the projection called name — every partition of a partitioned
// one — by name, without its definition, as Runner.Pause (to StatePaused) and Runner.Resume
// (to StateRunning from StatePaused) do. It is SetStateOfBy naming nobody.
func (b *Backend) SetStateOf(ctx context.Context, name string, to projection.State, from ...projection.State) (bool, error) {
	return b.SetStateOfBy(ctx, name, "", to, from...)
}

// SetStateOfBy sets the state of the projection called name — every partition of a partitioned
// one — by name, without its definition, as Runner.PauseBy (to StatePaused) and
// Runner.ResumeBy (to StateRunning from StatePaused) do: for an operator's tools (nudge pause
// and resume, the console). A change to or from StatePaused records by (who, NULL when empty)
// and the time in the row's state_changed_by and state_changed_at, which Status shows
// (StateChangedBy, StateChangedAt). Each row is locked as a batch locks it, so the change
// waits for a batch in flight and every process's next batch sees it. Rows already in state
// to, or (with from) in none of the from states, are left alone, with what they recorded. It
// reports whether a row changed, and wraps projection.ErrNotRegistered when no row has the
// name.
func (b *Backend) SetStateOfBy(ctx context.Context, name, by string, to projection.State, from ...projection.State) (bool, error) {
	var changed bool
	err := b.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, b.sql.unitsOf, name)
		if err != nil {
			return err
		}
		units, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(units) == 0 {
			return fmt.Errorf("projection %s: %w", name, projection.ErrNotRegistered)
		}
		for _, unit := range units { // in partition order, as lockAll takes them
			st, err := b.lock(ctx, tx, unit)
			if err != nil {
				return err
			}
			ok, err := b.changeState(ctx, tx, st, by, to, from)
			if err != nil {
				return err
			}
			changed = changed || ok
		}
		return nil
	})
	return changed, b.translate(err)
}
