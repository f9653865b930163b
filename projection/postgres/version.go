package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/projection"
)

// addVersionSQL adds the statements of versioned projections (nudge_projection_versions).
func (s *statements) addVersionSQL(r *strings.Replacer) {
	// A projection registered before versions existed (by code that did not know them) is
	// version 1, and active, when a newer version is first registered.
	s.legacyVersion = r.Replace(`INSERT INTO {versions} (projection, version, unit, state, activated_at)
		SELECT $1, 1, $1, 'active', p.created_at FROM {projections} p
		WHERE p.name = $1 AND NOT EXISTS (SELECT 1 FROM {versions} WHERE projection = $1)
		ON CONFLICT DO NOTHING`)
	// The first version registered is active at once; a higher one than the active builds
	// beside it; a lower one is retired (an old worker of a rolling deploy, late).
	s.registerVersion = r.Replace(`INSERT INTO {versions} AS v (projection, version, unit, state, tables, activated_at, retired_at)
		SELECT $1, $2, $3, st.state, $4, CASE WHEN st.state = 'active' THEN now() END, CASE WHEN st.state = 'retired' THEN now() END
		FROM (SELECT CASE WHEN a.version IS NULL THEN 'active' WHEN $2 > a.version THEN 'building' ELSE 'retired' END AS state
			FROM (SELECT 1) one LEFT JOIN {versions} a ON a.projection = $1 AND a.state = 'active') st
		ON CONFLICT (projection, version) DO UPDATE SET tables = EXCLUDED.tables
		WHERE v.tables IS DISTINCT FROM EXCLUDED.tables`)
	s.selectVersionState = r.Replace(`SELECT state FROM {versions} WHERE projection = $1 AND version = $2`)
	s.selectActiveVersion = r.Replace(`SELECT unit, version FROM {versions} WHERE projection = $1 AND state = 'active'`)
	// The version record of a unit and, for a building version, the active version's position,
	// state and lag: the age of the first readable event after its position, of its types
	// (one index probe per type), or of any type for a projection of every type.
	s.selectVersionInfo = r.Replace(`SELECT v.state, v.retired_at, v.dropped_at, ap.transaction_id, ap.global_position, ap.state,
		CASE WHEN v.state <> 'building' OR ap.name IS NULL THEN NULL
		WHEN ap.event_types IS NULL THEN (
			SELECT extract(epoch FROM clock_timestamp() - e.recorded_at)::float8 FROM {events} e
			WHERE (e.transaction_id, e.global_position) > (ap.transaction_id, ap.global_position) AND e.transaction_id < {horizon}
			ORDER BY e.transaction_id, e.global_position LIMIT 1)
		ELSE (
			SELECT extract(epoch FROM clock_timestamp() - min(f.recorded_at))::float8 FROM unnest(ap.event_types) t(type), LATERAL (
				SELECT e.recorded_at FROM {events} e
				WHERE (e.event_type, e.transaction_id, e.global_position) > (t.type, ap.transaction_id, ap.global_position)
					AND (e.event_type, e.transaction_id) < (t.type, {horizon})
				ORDER BY e.event_type, e.transaction_id, e.global_position LIMIT 1) f)
		END
		FROM {versions} v
		LEFT JOIN {versions} a ON a.projection = v.projection AND a.state = 'active'
		LEFT JOIN {projections} ap ON ap.name = a.unit
		WHERE v.unit = $1`)
	s.retireActive = r.Replace(`UPDATE {versions} SET state = 'retired', retired_at = now() WHERE projection = $1 AND state = 'active'`)
	s.activateVersion = r.Replace(`UPDATE {versions} SET state = 'active', activated_at = now() WHERE projection = $1 AND version = $2`)
	s.markDropped = r.Replace(`UPDATE {versions} SET dropped_at = now() WHERE unit = $1`)
	s.deleteVersion = r.Replace(`DELETE FROM {versions} WHERE unit = $1`)
	s.deadLettersExist = r.Replace(`SELECT to_regclass('{deadletters}') IS NOT NULL`)
	s.pendingDeadLetters = r.Replace(`SELECT EXISTS (SELECT 1 FROM {deadletters} WHERE projection = $1 AND status = 'failed')`)
}

// scanVersionInfo reads a row of selectVersionInfo into v.
func scanVersionInfo(row pgx.Row, v *projection.VersionInfo) error {
	var (
		state            string
		retired, dropped *time.Time
		activeTx         *uint64
		activePos        *int64
		activeState      *string
		activeLag        *float64
	)
	if err := row.Scan(&state, &retired, &dropped, &activeTx, &activePos, &activeState, &activeLag); err != nil {
		return err
	}
	v.State, v.RetiredAt, v.DroppedAt = projection.VersionState(state), deref(retired), deref(dropped)
	v.ActiveState, v.ActiveLag = projection.State(deref(activeState)), time.Duration(max(deref(activeLag), 0)*float64(time.Second))
	v.ActivePosition.TransactionID, v.ActivePosition.GlobalPosition = deref(activeTx), deref(activePos)
	return nil
}

// registerVersion takes the locks of p's registration (the projection's own name first, the
// lock of its version 1, then p's unit: the order of every unit that holds two), records p's
// version and returns its state.
func (b *Backend) registerVersion(ctx context.Context, tx pgx.Tx, p *projection.Projection) (projection.VersionState, error) {
	if err := b.lockUnits(ctx, tx, p.Base(), p.Name()); err != nil {
		return "", err
	}
	if p.Version() > 1 {
		if _, err := tx.Exec(ctx, b.sql.legacyVersion, p.Base()); err != nil {
			return "", err
		}
	}
	tables := p.Tables()
	if tables == nil {
		tables = []string{}
	}
	if _, err := tx.Exec(ctx, b.sql.registerVersion, p.Base(), p.Version(), p.Name(), tables); err != nil {
		return "", err
	}
	var state string
	if err := tx.QueryRow(ctx, b.sql.selectVersionState, p.Base(), p.Version()).Scan(&state); err != nil {
		return "", err
	}
	return projection.VersionState(state), nil
}

// lockUnits takes the advisory locks of units, in order, skipping repeats.
func (b *Backend) lockUnits(ctx context.Context, tx pgx.Tx, units ...string) error {
	for i, u := range units {
		if u == "" || (i > 0 && u == units[i-1]) {
			continue
		}
		if _, err := tx.Exec(ctx, b.sql.lock, u); err != nil {
			return err
		}
	}
	return nil
}

// createViews creates the stable name of each of p's tables that does not exist yet, as a view
// of p's version of it. It leaves an existing view alone (only a cut-over replaces one).
func (b *Backend) createViews(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	for _, t := range p.Tables() {
		var kind *string
		if err := tx.QueryRow(ctx, `SELECT (SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1))`, pgx.Identifier{t}.Sanitize()).Scan(&kind); err != nil {
			return fmt.Errorf("look up the stable name %s: %w", t, err)
		}
		switch {
		case kind == nil:
			if _, err := tx.Exec(ctx, viewSQL("CREATE VIEW", t, p.Version())); err != nil {
				return fmt.Errorf("create the view %s of version %d: %w", t, p.Version(), err)
			}
		case *kind != "v":
			return fmt.Errorf("projection %s: %w: %s exists and is not a view (relkind %s); rename it to %s (version %d's table) so that %s can be a view of the active version",
				p.Base(), projection.ErrInvalidConfig, t, *kind, projection.TableName(t, p.Version()), p.Version(), t)
		}
	}
	return nil
}

// viewSQL is the statement verb (CREATE VIEW, CREATE OR REPLACE VIEW) of the view stable over
// version's table.
func viewSQL(verb, stable string, version int) string {
	return verb + " " + pgx.Identifier{stable}.Sanitize() + " AS SELECT * FROM " + pgx.Identifier{projection.TableName(stable, version)}.Sanitize()
}

// replaceViews points every stable name of p's tables at p's tables: CREATE OR REPLACE VIEW,
// or, when the columns changed (which OR REPLACE refuses), DROP and CREATE, both in tx.
func (b *Backend) replaceViews(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	for _, t := range p.Tables() {
		sp, err := tx.Begin(ctx) // a savepoint: a refused replace does not abort tx
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, viewSQL("CREATE OR REPLACE VIEW", t, p.Version())); err == nil {
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			continue
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DROP VIEW IF EXISTS "+pgx.Identifier{t}.Sanitize()); err != nil {
			return fmt.Errorf("replace the view %s (is it a table? rename it to %s): %w", t, projection.TableName(t, p.Version()-1), err)
		}
		if _, err := tx.Exec(ctx, viewSQL("CREATE VIEW", t, p.Version())); err != nil {
			return fmt.Errorf("create the view %s of version %d: %w", t, p.Version(), err)
		}
	}
	return nil
}

// Activate implements projection.Backend. It holds the projection's own name's lock (its
// version 1's), the active version's and p's: batches of the active version wait for it, then
// find their version retired and do nothing.
func (b *Backend) Activate(ctx context.Context, p *projection.Projection, fn projection.BatchFunc, hook projection.HookFunc) (projection.Activation, error) {
	var (
		act   projection.Activation
		start time.Time
	)
	err := b.inTxWith(ctx, b.batchOptions(p), func(tx pgx.Tx) error {
		act = projection.Activation{}
		c := cutover{b: b, tx: tx, p: p, act: &act}
		ready, err := c.lockAndCheck(ctx)
		if err != nil || !ready {
			return err
		}
		start = time.Now()
		return c.run(ctx, fn, hook)
	})
	if err != nil || !act.Activated {
		return projection.Activation{Reason: act.Reason}, err
	}
	act.Held = time.Since(start)
	return act, nil
}

// cutover is one Activate in its transaction.
type cutover struct {
	b      *Backend
	tx     pgx.Tx
	p      *projection.Projection
	act    *projection.Activation
	st     projection.Status
	parked map[string]projection.ParkedStream
	ver    projection.VersionInfo
}

// lockAndCheck takes the locks (in the order of registerVersion) and reports whether p may
// cut over, with the reason in act when not.
func (c *cutover) lockAndCheck(ctx context.Context) (bool, error) {
	p, tx := c.p, c.tx
	if err := c.b.lockUnits(ctx, tx, p.Base()); err != nil {
		return false, err
	}
	var activeUnit string
	err := tx.QueryRow(ctx, c.b.sql.selectActiveVersion, p.Base()).Scan(&activeUnit, &c.act.Previous)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	if activeUnit != p.Base() {
		if err := c.b.lockUnits(ctx, tx, activeUnit); err != nil {
			return false, err
		}
	}
	c.parked = make(map[string]projection.ParkedStream)
	if c.st, err = c.b.lockWith(ctx, tx, p.Name(), c.parked, &c.ver); err != nil {
		return false, err
	}
	reason, err := c.notReady(ctx)
	c.act.Reason = reason
	return reason == "" && err == nil, err
}

// notReady says why p may not cut over now; empty when it may.
func (c *cutover) notReady(ctx context.Context) (string, error) {
	switch {
	case c.ver.State != projection.VersionBuilding:
		return fmt.Sprintf("version %d is %s, not building", c.p.Version(), c.ver.State), nil
	case c.st.State != projection.StateRunning && c.st.State != projection.StateFailing:
		return fmt.Sprintf("version %d is %s", c.p.Version(), c.st.State), nil
	case len(c.parked) > 0:
		return fmt.Sprintf("version %d has %d parked streams", c.p.Version(), len(c.parked)), nil
	}
	var exist, pending bool
	if err := c.tx.QueryRow(ctx, c.b.sql.deadLettersExist).Scan(&exist); err != nil || !exist {
		return "", err
	}
	if err := c.tx.QueryRow(ctx, c.b.sql.pendingDeadLetters, c.p.Name()).Scan(&pending); err != nil {
		return "", err
	}
	if pending {
		return fmt.Sprintf("version %d has dead letters to replay or resolve", c.p.Version()), nil
	}
	return "", nil
}

// run brings p to the head (fn), stores the outcome, points the views at p's tables, runs the
// hook and flips the version records.
func (c *cutover) run(ctx context.Context, fn projection.BatchFunc, hook projection.HookFunc) error {
	c.ver.State = "" // the cut-over handles live events, not history
	out, err := fn(ctx, c.b.unit(c.tx, c.st, c.parked, c.ver))
	if err != nil {
		return err
	}
	if err := c.b.storeOutcome(ctx, c.tx, c.p, c.st, out); err != nil {
		return err
	}
	if err := c.b.replaceViews(ctx, c.tx, c.p); err != nil {
		return err
	}
	if err := runHook(ctx, c.tx, hook); err != nil {
		return err
	}
	if _, err := c.tx.Exec(ctx, c.b.sql.retireActive, c.p.Base()); err != nil {
		return err
	}
	if _, err := c.tx.Exec(ctx, c.b.sql.activateVersion, c.p.Base(), c.p.Version()); err != nil {
		return err
	}
	c.act.Activated, c.act.Events = true, out.Processed
	return nil
}

// DropRetired implements projection.Backend.
func (b *Backend) DropRetired(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		var ver projection.VersionInfo
		if _, err := b.lockWith(ctx, tx, p.Name(), nil, &ver); err != nil {
			return err
		}
		switch {
		case ver.State != projection.VersionRetired:
			return fmt.Errorf("projection %s version %d is %q: %w", p.Name(), p.Version(), ver.State, projection.ErrNotRetired)
		case !ver.DroppedAt.IsZero():
			return nil
		}
		if err := runHook(ctx, tx, hook); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, b.sql.markDropped, p.Name())
		return err
	})
}
