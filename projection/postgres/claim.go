package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// addClaimSQL adds the statements of a building version's claims (projection.VersionInfo's
// Claiming and Claims).
func (s *statements) addClaimSQL(r *strings.Replacer) {
	// For an active version's unit ($1; a partitioned projection's definition): the committed
	// positions of every building version's units, by version, in index order.
	s.selectClaims = r.Replace(`SELECT b.version, x.transaction_id, x.global_position FROM {versions} v
		JOIN {versions} b ON b.projection = v.projection AND b.state = 'building'
		JOIN {projections} x ON (x.name = b.unit AND x.partition_of IS NULL) OR x.partition_of = b.unit
		WHERE v.unit = $1 AND v.state = 'active'
		ORDER BY b.version, x.partition_index`)
	// For the only building version's unit ($1, partition $2 of $3): the active version's unit
	// name, once this transaction holds the locks of all of the active version's units that
	// can hold streams of the building unit, taken in index order and waiting for each (the
	// caller bounds the wait with lock_timeout). No row when $1 is not the only building
	// version.
	s.claimActive = r.Replace(`WITH c AS MATERIALIZED (SELECT a.unit FROM {versions} v
			JOIN {versions} a ON a.projection = v.projection AND a.state = 'active'
			WHERE v.unit = $1 AND v.state = 'building'
				AND NOT EXISTS (SELECT 1 FROM {versions} o WHERE o.projection = v.projection AND o.state = 'building' AND o.version <> v.version))
		SELECT c.unit FROM c CROSS JOIN LATERAL (SELECT count(pg_advisory_xact_lock({class}, hashtext('{schema}.' || x.name))) AS locked
			FROM (SELECT x.name FROM {projections} x
				WHERE (x.name = c.unit AND x.partition_of IS NULL)
					OR (x.partition_of = c.unit AND x.partition_index % gcd(x.partition_count, $3::int) = $2::int % gcd(x.partition_count, $3::int))
				ORDER BY x.partition_index) x) l
		WHERE l.locked > 0`)
	// The committed positions of the units of an active version's unit ($1), in index order.
	s.selectActivePositions = r.Replace(`SELECT transaction_id, global_position FROM {projections}
		WHERE (name = $1 AND partition_of IS NULL) OR partition_of = $1 ORDER BY partition_index`)
}

// queueClaims queues, on batch, the read of the building versions' positions into
// info.Claims, for the unit unit when it is an active version's.
func (b *Backend) queueClaims(batch *pgx.Batch, unit string, info *projection.VersionInfo) {
	batch.Queue(b.sql.selectClaims, unit).Query(func(rows pgx.Rows) error {
		info.Claims = nil
		last := 0
		for rows.Next() {
			var (
				version int
				at      eventstore.Position
			)
			if err := rows.Scan(&version, &at.TransactionID, &at.GlobalPosition); err != nil {
				return err
			}
			if version != last || len(info.Claims) == 0 {
				info.Claims, last = append(info.Claims, nil), version
			}
			info.Claims[len(info.Claims)-1] = append(info.Claims[len(info.Claims)-1], at)
		}
		return rows.Err()
	})
}

// claimWaitDefault bounds how long a building version's batch waits for each lock of the
// active version it claims past (Backend.claimWait). A busy active version runs its batches
// back to back: a claim that only tried its lock seldom found it free, and a building version
// level with an active version that lags stayed level with it, too far from the head to cut
// over, for as long as the active version lagged. Waiting for the batch in flight to commit
// lets the claim in between two of them. The bound stays under PostgreSQL's deadlock_timeout
// (1 s by default): a wait that could close a cycle with a cut-over ends as a lock timeout,
// which only makes the batch handle history, before the deadlock detector aborts anything.
const claimWaitDefault = 500 * time.Millisecond

// claimSavepoint encloses a claim's wait for the active version's locks: a wait that times out
// rolls back to it, releasing the locks the claim took, and the batch goes on with history.
const claimSavepoint = "nudge_claim"

// claim lets the batch of p, a building version's unit whose read reaches past the active
// version's position, claim the events after it (projection.Unit.Claim): when p's version is
// the only building one and this transaction takes the locks of the active version's units
// that can hold p's streams, waiting up to b.claimWait for each, it sets ver.Claiming and
// reads the active version's positions anew under them. A wait that times out (an active
// batch longer than that) leaves the batch with history only, as before, and holding none of
// those locks.
func (b *Backend) claim(ctx context.Context, tx pgx.Tx, p *projection.Projection, ver *projection.VersionInfo) error {
	if ver.State != projection.VersionBuilding {
		return nil
	}
	part := p.Partition()
	var (
		batch   pgx.Batch
		timeout string // the transaction's lock_timeout, put back once the locks are taken
		active  string
	)
	batch.Queue(`SAVEPOINT ` + claimSavepoint)
	batch.Queue(`SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`,
		strconv.FormatInt(max(b.claimWait.Milliseconds(), 1), 10)).QueryRow(func(row pgx.Row) error {
		var set string
		return row.Scan(&timeout, &set)
	})
	batch.Queue(b.sql.claimActive, p.Definition().Name(), part.Index, max(part.Count, 1)).QueryRow(func(row pgx.Row) error {
		return row.Scan(&active)
	})
	err := tx.SendBatch(ctx, &batch).Close()
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) && !isLockTimeout(err) {
			return err
		}
		// Not the only building version, or the active version stayed busy: history only.
		_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT `+claimSavepoint)
		return err
	}
	batch = pgx.Batch{}
	batch.Queue(`SELECT set_config('lock_timeout', $1, true)`, timeout)
	batch.Queue(`RELEASE SAVEPOINT ` + claimSavepoint)
	var positions []eventstore.Position
	batch.Queue(b.sql.selectActivePositions, active).Query(func(rows pgx.Rows) error {
		var err error
		positions, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (eventstore.Position, error) {
			var at eventstore.Position
			return at, row.Scan(&at.TransactionID, &at.GlobalPosition)
		})
		return err
	})
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil || len(positions) == 0 {
		return err
	}
	ver.Claiming = true
	ver.ActivePartitions = nil
	ver.ActivePosition = positions[0]
	if len(positions) > 1 {
		ver.ActivePartitions = positions
		ver.ActivePosition = positions[part.Overlapping(len(positions))[0]]
		for _, k := range part.Overlapping(len(positions)) {
			if positions[k].Less(ver.ActivePosition) {
				ver.ActivePosition = positions[k]
			}
		}
	}
	return nil
}

// isLockTimeout reports whether err is PostgreSQL's lock_timeout ending a wait for a lock.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}
