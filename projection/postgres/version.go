package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/eventstore"
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
		WHERE v.tables IS DISTINCT FROM EXCLUDED.tables AND cardinality(EXCLUDED.tables) > 0`)
	// A version 1 whose plain tables a newer version adopted (see adoptTables) keeps them
	// recorded, so their versioned names are dropped once it is retired.
	s.recordAdopted = r.Replace(`UPDATE {versions} SET tables = array(SELECT DISTINCT unnest(tables || $2::text[]) ORDER BY 1)
		WHERE projection = $1 AND version = 1`)
	s.selectVersionState = r.Replace(`SELECT state FROM {versions} WHERE projection = $1 AND version = $2`)
	s.selectActiveVersion = r.Replace(`SELECT unit, version FROM {versions} WHERE projection = $1 AND state = 'active'`)
	// The version record of a unit ($1; a partitioned projection's definition); for a
	// building version, the active version's position, state and lag, from its unit with the
	// lowest position among those that can hold streams of the building unit (partition $2 of
	// $3: see eventstore.Partition.Overlapping): the age of the first readable event after
	// that position, of its types (one index probe per type), or of any type for a projection
	// of every type; for an active version, the oldest retired version whose read model is not
	// dropped.
	s.selectVersionInfo = r.Replace(`SELECT v.state, v.retired_at, v.dropped_at, ap.transaction_id, ap.global_position, ap.state,
		CASE WHEN ap.name IS NULL THEN NULL
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
		END, o.version, o.retired_at
		FROM {versions} v
		LEFT JOIN {versions} a ON a.projection = v.projection AND a.state = 'active'
		LEFT JOIN LATERAL (SELECT x.name, x.transaction_id, x.global_position, x.state, x.event_types FROM {projections} x
			WHERE v.state = 'building' AND ((x.name = a.unit AND x.partition_of IS NULL)
				OR (x.partition_of = a.unit AND x.partition_index % gcd(x.partition_count, $3::int) = $2::int % gcd(x.partition_count, $3::int)))
			ORDER BY x.transaction_id, x.global_position LIMIT 1) ap ON true
		LEFT JOIN LATERAL (SELECT r.version, r.retired_at FROM {versions} r WHERE v.state = 'active' AND r.projection = v.projection
			AND r.state = 'retired' AND r.dropped_at IS NULL ORDER BY r.retired_at, r.version LIMIT 1) o ON true
		WHERE v.unit = $1`)
	// The committed positions of a partitioned projection's partitions, in index order.
	s.selectPartitionPositions = r.Replace(`SELECT transaction_id, global_position FROM {projections} WHERE partition_of = $1 ORDER BY partition_index`)
	s.selectPartitionNames = r.Replace(`SELECT name FROM {projections} WHERE partition_of = $1 ORDER BY partition_index`)
	s.selectVersionTables = r.Replace(`SELECT tables FROM {versions} WHERE unit = $1`)
	s.retireActive = r.Replace(`UPDATE {versions} SET state = 'retired', retired_at = now() WHERE projection = $1 AND state = 'active'`)
	s.activateVersion = r.Replace(`UPDATE {versions} SET state = 'active', activated_at = now() WHERE projection = $1 AND version = $2`)
	s.markDropped = r.Replace(`UPDATE {versions} SET dropped_at = now() WHERE unit = $1`)
	s.deleteVersion = r.Replace(`DELETE FROM {versions} WHERE unit = $1`)
	s.deadLettersExist = r.Replace(`SELECT to_regclass('{deadletters}') IS NOT NULL`)
	s.pendingDeadLetters = r.Replace(`SELECT EXISTS (SELECT 1 FROM {deadletters} WHERE projection = ANY($1::text[]) AND status = 'failed')`)
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
		oldVersion       *int
		oldRetired       *time.Time
	)
	if err := row.Scan(&state, &retired, &dropped, &activeTx, &activePos, &activeState, &activeLag, &oldVersion, &oldRetired); err != nil {
		return err
	}
	v.State, v.RetiredAt, v.DroppedAt = projection.VersionState(state), deref(retired), deref(dropped)
	v.ActiveState, v.ActiveLag = projection.State(deref(activeState)), time.Duration(max(deref(activeLag), 0)*float64(time.Second))
	v.Undropped = projection.RetiredVersion{Version: deref(oldVersion), RetiredAt: deref(oldRetired)}
	v.ActivePosition.TransactionID, v.ActivePosition.GlobalPosition = deref(activeTx), deref(activePos)
	return nil
}

// versionRead is a read of a unit's version record (selectVersionInfo) into info: the record
// of unit (a partitioned projection's definition for its partitions), seen from part, the
// building unit's part of the log.
type versionRead struct {
	info *projection.VersionInfo
	unit string
	part eventstore.Partition
}

// versionOf is the read of p's version record into info.
func versionOf(p *projection.Projection, info *projection.VersionInfo) *versionRead {
	return &versionRead{info: info, unit: p.Definition().Name(), part: p.Partition()}
}

// queueVersionInfo queues the read of ver in batch.
func (b *Backend) queueVersionInfo(batch *pgx.Batch, ver *versionRead) {
	batch.Queue(b.sql.selectVersionInfo, ver.unit, ver.part.Index, max(ver.part.Count, 1)).Query(func(rows pgx.Rows) error {
		if rows.Next() {
			if err := scanVersionInfo(rows, ver.info); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	b.queueClaims(batch, ver.unit, ver.info)
}

// lockVersion takes the lock of unit (a version's unit name; a partitioned projection's
// definition) and those of its partitions, in index order, and reads its version record: for
// changes of a version as a whole that need no status row (a partitioned projection's
// definition has none).
func (b *Backend) lockVersion(ctx context.Context, tx pgx.Tx, unit string, info *projection.VersionInfo) error {
	if _, err := b.lockPartitioned(ctx, tx, unit); err != nil {
		return err
	}
	var batch pgx.Batch
	b.queueVersionInfo(&batch, &versionRead{info: info, unit: unit})
	return tx.SendBatch(ctx, &batch).Close()
}

// lockPartitioned takes the lock of unit, then, when it is a partitioned projection's
// definition, those of its partitions, in index order, and returns their names.
func (b *Backend) lockPartitioned(ctx context.Context, tx pgx.Tx, unit string) ([]string, error) {
	rows, err := tx.Query(ctx, b.sql.selectPartitionNames, unit)
	if err != nil {
		return nil, err
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return parts, b.lockUnits(ctx, tx, append([]string{unit}, parts...)...)
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

// lockUnits takes the advisory locks of units, in order, skipping repeats, in one round trip.
func (b *Backend) lockUnits(ctx context.Context, tx pgx.Tx, units ...string) error {
	var batch pgx.Batch
	for i, u := range units {
		if u == "" || (i > 0 && u == units[i-1]) {
			continue
		}
		batch.Queue(b.sql.lock, u)
	}
	if batch.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &batch).Close()
}

// stableName is where a stable name resolves on the search path: its schema and relkind
// ('r' a table, 'p' a partitioned table, 'v' a view, …); kind is empty when nothing has the name.
type stableName struct {
	schema, kind string
	// current is the schema where new tables and views go: current_schema(), the first
	// existing schema of the search path.
	current string
}

// lookupStable resolves the stable name t on tx's search path.
func lookupStable(ctx context.Context, tx pgx.Tx, t string) (stableName, error) {
	var schema, kind, current *string
	err := tx.QueryRow(ctx, `SELECT n.nspname::text, c.relkind::text, current_schema()::text FROM (SELECT to_regclass($1) AS oid) r
		LEFT JOIN pg_class c ON c.oid = r.oid LEFT JOIN pg_namespace n ON n.oid = c.relnamespace`, pgx.Identifier{t}.Sanitize()).Scan(&schema, &kind, &current)
	if err != nil {
		return stableName{}, fmt.Errorf("look up the stable name %s: %w", t, err)
	}
	return stableName{schema: deref(schema), kind: deref(kind), current: deref(current)}, nil
}

// isTable reports whether the name is a plain or partitioned table.
func (n stableName) isTable() bool { return n.kind == "r" || n.kind == "p" }

// createViews creates the stable name of each of p's tables that does not exist yet, as a view
// of p's version of it. It leaves an existing view alone (only a cut-over replaces one).
func (b *Backend) createViews(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	for _, t := range p.Tables() {
		n, err := lookupStable(ctx, tx, t)
		if err != nil {
			return err
		}
		switch {
		case n.kind == "":
			if _, err := tx.Exec(ctx, viewSQL("CREATE VIEW", t, p.Version())); err != nil {
				return fmt.Errorf("create the view %s of version %d: %w", t, p.Version(), err)
			}
		case n.kind != "v":
			return fmt.Errorf("projection %s: %w: %s exists and is not a view (relkind %s); rename it to %s (version %d's table) so that %s can be a view of the active version",
				p.Base(), projection.ErrInvalidConfig, t, n.kind, projection.TableName(t, p.Version()), p.Version(), t)
		}
	}
	return nil
}

// adoptTables makes the stable names of a building version p views, where they are still
// the plain tables of a version 1 that predates versions (or never declared Config.Tables):
// each such table is renamed to its version 1 name ("ticket_list" to "ticket_list_v1", its
// indexes, constraints and grants with it) and its name becomes a view of it, in the same
// schema, and version 1's record lists it (so it is dropped once retired). The caller holds
// the locks of registerVersion, version 1's among them: no batch of version 1 runs meanwhile.
// Version 1 code keeps writing through the view (a simple view is updatable: INSERT, UPDATE,
// DELETE, ON CONFLICT), until the cut-over replaces the view. A plain table under the stable
// name of a projection whose active version is not 1 is refused.
func (b *Backend) adoptTables(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	var adopted []string
	for _, t := range p.Tables() {
		n, err := lookupStable(ctx, tx, t)
		if err != nil || !n.isTable() {
			return err
		}
		var active int
		if err := tx.QueryRow(ctx, b.sql.selectActiveVersion, p.Base()).Scan(new(string), &active); err != nil {
			return fmt.Errorf("adopt %s: read the active version: %w", t, err)
		}
		v1 := projection.TableName(t, 1)
		switch {
		case n.schema != n.current:
			return fmt.Errorf("projection %s: %w: version 1's table %s is in schema %q, but the versions' tables and views are created in %q, the first schema of the search path; "+
				"put %q first on the search path of the workers' connections (or move the table)", p.Base(), projection.ErrInvalidConfig, t, n.schema, n.current, n.schema)
		case active != 1:
			return fmt.Errorf("projection %s: %w: %s is a table, not a view, while version %d is active; rename it to %s (version %d's table) so that %s can be a view of the active version",
				p.Base(), projection.ErrInvalidConfig, t, active, projection.TableName(t, active), active, t)
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+pgx.Identifier{n.schema, t}.Sanitize()+` RENAME TO `+pgx.Identifier{v1}.Sanitize()); err != nil {
			return fmt.Errorf("projection %s: adopt version 1's table %s.%s as %s: %w", p.Base(), n.schema, t, v1, err)
		}
		if _, err := tx.Exec(ctx, `CREATE VIEW `+pgx.Identifier{n.schema, t}.Sanitize()+` AS SELECT * FROM `+pgx.Identifier{n.schema, v1}.Sanitize()); err != nil {
			return fmt.Errorf("projection %s: create the view %s.%s of version 1's table: %w", p.Base(), n.schema, t, err)
		}
		adopted = append(adopted, t)
	}
	if len(adopted) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, b.sql.recordAdopted, p.Base(), adopted)
	return err
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
// version 1's), the active version's units' and p's (a partitioned version's definition's,
// then its partitions', in index order): batches of the active version wait for it, then find
// their version retired and do nothing.
func (b *Backend) Activate(ctx context.Context, p *projection.Projection, co projection.CutOver, hook projection.HookFunc) (projection.Activation, error) {
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
		if ready, err = c.level(ctx, co); err != nil || !ready {
			return err
		}
		start = time.Now()
		return c.run(ctx, co, hook)
	})
	if err != nil || !act.Activated {
		return projection.Activation{Reason: act.Reason, Behind: act.Behind}, err
	}
	act.Held = time.Since(start)
	return act, nil
}

// cutover is one Activate in its transaction.
type cutover struct {
	b     *Backend
	tx    pgx.Tx
	p     *projection.Projection
	act   *projection.Activation
	units []cutoverUnit
}

// cutoverUnit is a unit of the building version as the cut-over locked it.
type cutoverUnit struct {
	p      *projection.Projection
	st     projection.Status
	parked map[string]projection.ParkedStream
	ver    projection.VersionInfo
}

// lockAndCheck takes the locks (in the order of registerVersion: the projection's own name,
// the active version's units, p's) and reports whether p may cut over, with the reason in act
// when not.
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
	var activeParts []eventstore.Position
	if activeUnit != "" {
		parts, err := c.b.lockPartitioned(ctx, tx, activeUnit)
		if err != nil {
			return false, err
		}
		if len(parts) > 0 {
			rows, err := tx.Query(ctx, c.b.sql.selectPartitionPositions, activeUnit)
			if err != nil {
				return false, err
			}
			if activeParts, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (eventstore.Position, error) {
				var at eventstore.Position
				return at, row.Scan(&at.TransactionID, &at.GlobalPosition)
			}); err != nil {
				return false, err
			}
		}
	}
	if err := c.b.lockUnits(ctx, tx, p.Name()); err != nil {
		return false, err
	}
	for _, u := range p.Units() {
		cu := cutoverUnit{p: u, parked: make(map[string]projection.ParkedStream)}
		if cu.st, err = c.b.lockWith(ctx, tx, u.Name(), cu.parked, versionOf(u, &cu.ver), nil); err != nil {
			return false, err
		}
		cu.ver.ActivePartitions = activeParts
		c.units = append(c.units, cu)
	}
	reason, err := c.notReady(ctx)
	c.act.Reason = reason
	return reason == "" && err == nil, err
}

// notReady says why p may not cut over now; empty when it may.
func (c *cutover) notReady(ctx context.Context) (string, error) {
	names := make([]string, len(c.units))
	for k, u := range c.units {
		names[k] = u.p.Name()
		switch {
		case u.ver.State != projection.VersionBuilding:
			return fmt.Sprintf("version %d is %s, not building", c.p.Version(), u.ver.State), nil
		case u.st.State != projection.StateRunning && u.st.State != projection.StateFailing:
			return fmt.Sprintf("%s (version %d) is %s", u.p.Name(), c.p.Version(), u.st.State), nil
		case len(u.parked) > 0:
			return fmt.Sprintf("%s (version %d) has %d parked streams", u.p.Name(), c.p.Version(), len(u.parked)), nil
		}
	}
	var exist, pending bool
	if err := c.tx.QueryRow(ctx, c.b.sql.deadLettersExist).Scan(&exist); err != nil || !exist {
		return "", err
	}
	if err := c.tx.QueryRow(ctx, c.b.sql.pendingDeadLetters, names).Scan(&pending); err != nil {
		return "", err
	}
	if pending {
		return fmt.Sprintf("version %d has dead letters to replay or resolve", c.p.Version()), nil
	}
	return "", nil
}

// level asks every unit whether it is behind (co.Behind) and reports whether none is, with
// the reason in act when one is.
func (c *cutover) level(ctx context.Context, co projection.CutOver) (bool, error) {
	for _, u := range c.units {
		behind, err := co.Behind(ctx, u.p, c.b.unit(c.tx, u.st, u.parked, u.ver))
		if err != nil || !behind {
			if err != nil {
				return false, err
			}
			continue
		}
		c.act.Reason = fmt.Sprintf("%s (version %d) has more than a batch of events left to the head", u.p.Name(), c.p.Version())
		c.act.Behind = true
		return false, nil
	}
	return true, nil
}

// run brings every unit of p to the head (co.Run), stores the outcomes, points the views at
// p's tables, runs the hook and flips the version records.
func (c *cutover) run(ctx context.Context, co projection.CutOver, hook projection.HookFunc) error {
	events := 0
	for _, u := range c.units {
		out, err := co.Run(ctx, u.p, c.b.unit(c.tx, u.st, u.parked, u.ver))
		if err != nil {
			return err
		}
		if err := c.b.storeOutcome(ctx, c.tx, u.p, u.st, out); err != nil {
			return err
		}
		events += out.Processed
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
	c.act.Activated, c.act.Events = true, events
	return nil
}

// DropRetired implements projection.Backend. It holds the locks of p's units (a partitioned
// version's definition's and its partitions').
func (b *Backend) DropRetired(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		var ver projection.VersionInfo
		if err := b.lockVersion(ctx, tx, p.Name(), &ver); err != nil {
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

// wrongObjectType is PostgreSQL's SQLSTATE for a statement a relation of that kind refuses,
// e.g. CREATE INDEX, ALTER TABLE or TRUNCATE on a view.
const wrongObjectType = "42809"

// viewRefused explains a hook's error when its statement was refused because it named a view
// and p is a version 1 without Config.Tables: its tables may have been adopted by a newer
// version (adoptTables), which made their names views. Other errors are returned as they are.
func viewRefused(p *projection.Projection, which string, err error) error {
	var pgErr *pgconn.PgError
	if p.Version() != 1 || len(p.Tables()) > 0 || !errors.As(err, &pgErr) || pgErr.Code != wrongObjectType {
		return err
	}
	return fmt.Errorf("projection %s: a statement of its %s hook was refused on a view: while a newer version is built beside version 1, "+
		"version 1's tables are renamed <table>_v1 and their names are views of them; version 1 must not change or truncate its tables "+
		"until the newer version has taken over (version 1 is then retired and runs no hooks): %w", p.Name(), which, err)
}

// DropRetiredTables implements projection.Backend: holding the lock of version's unit, it
// drops the versioned table (projection.TableName) of every stable name recorded for that
// version, in the schema where the stable name resolves, and records the drop.
func (b *Backend) DropRetiredTables(ctx context.Context, p *projection.Projection, version int) error {
	unit, err := projection.UnitName(p.Base(), version)
	if err != nil {
		return err
	}
	return b.inTx(ctx, func(tx pgx.Tx) error {
		var ver projection.VersionInfo
		if err := b.lockVersion(ctx, tx, unit, &ver); err != nil {
			return err
		}
		switch {
		case ver.State != projection.VersionRetired:
			return fmt.Errorf("projection %s version %d is %q: %w", unit, version, ver.State, projection.ErrNotRetired)
		case !ver.DroppedAt.IsZero():
			return nil
		}
		var tables []string
		if err := tx.QueryRow(ctx, b.sql.selectVersionTables, unit).Scan(&tables); err != nil {
			return err
		}
		for _, t := range tables {
			n, err := lookupStable(ctx, tx, t)
			if err != nil {
				return err
			}
			name := pgx.Identifier{projection.TableName(t, version)}
			if n.schema != "" {
				name = pgx.Identifier{n.schema, projection.TableName(t, version)}
			}
			if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+name.Sanitize()); err != nil {
				return fmt.Errorf("drop %s of the retired version %d: %w", name.Sanitize(), version, err)
			}
		}
		_, err := tx.Exec(ctx, b.sql.markDropped, unit)
		return err
	})
}
