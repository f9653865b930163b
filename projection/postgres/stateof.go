package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/projection"
)

// SetStateOf sets the state of the projection called name — every partition of a partitioned
// one — by name, without its definition, as Runner.Pause (to StatePaused) and Runner.Resume
// (to StateRunning from StatePaused) do: for an operator's tools (nudge pause, the console).
// Each row is locked as a batch locks it, so the change waits for a batch in flight and every
// process's next batch sees it. Rows already in state to, or (with from) in none of the from
// states, are left alone. It reports whether a row changed, and wraps
// projection.ErrNotRegistered when no row has the name.
func (b *Backend) SetStateOf(ctx context.Context, name string, to projection.State, from ...projection.State) (bool, error) {
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
			if st.State == to || (len(from) > 0 && !slices.Contains(from, st.State)) {
				continue
			}
			changed = true
			if _, err := tx.Exec(ctx, b.sql.setState, unit, string(to)); err != nil {
				return err
			}
		}
		return nil
	})
	return changed, b.translate(err)
}
