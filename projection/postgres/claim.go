package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

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
	// name, and whether this transaction took, without waiting, the locks of all of the active
	// version's units that can hold streams of the building unit. No row when $1 is not the
	// only building version.
	s.claimActive = r.Replace(`SELECT a.unit, l.locked FROM {versions} v
		JOIN {versions} a ON a.projection = v.projection AND a.state = 'active'
		CROSS JOIN LATERAL (SELECT count(*) > 0 AND bool_and(pg_try_advisory_xact_lock({class}, hashtext('{schema}.' || x.name))) AS locked
			FROM {projections} x
			WHERE (x.name = a.unit AND x.partition_of IS NULL)
				OR (x.partition_of = a.unit AND x.partition_index % gcd(x.partition_count, $3::int) = $2::int % gcd(x.partition_count, $3::int))) l
		WHERE v.unit = $1 AND v.state = 'building'
			AND NOT EXISTS (SELECT 1 FROM {versions} o WHERE o.projection = v.projection AND o.state = 'building' AND o.version <> v.version)`)
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

// claim lets the batch of p, a building version's unit whose read reaches past the active
// version's position, claim the events after it (projection.Unit.Claim): when p's version is the only building one and
// this transaction takes, without waiting, the locks of the active version's units that can
// hold p's streams, it sets ver.Claiming and reads the active version's positions anew under
// them. A busy active version (a batch of it holds its lock) is not waited for: the batch
// then handles history only, as before.
func (b *Backend) claim(ctx context.Context, tx pgx.Tx, p *projection.Projection, ver *projection.VersionInfo) error {
	if ver.State != projection.VersionBuilding {
		return nil
	}
	part := p.Partition()
	var (
		active string
		locked bool
	)
	err := tx.QueryRow(ctx, b.sql.claimActive, p.Definition().Name(), part.Index, max(part.Count, 1)).Scan(&active, &locked)
	if err == pgx.ErrNoRows || (err == nil && !locked) { //nolint:errorlint // QueryRow returns pgx.ErrNoRows itself.
		return nil
	}
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, b.sql.selectActivePositions, active)
	if err != nil {
		return err
	}
	positions, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (eventstore.Position, error) {
		var at eventstore.Position
		return at, row.Scan(&at.TransactionID, &at.GlobalPosition)
	})
	if err != nil || len(positions) == 0 {
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
