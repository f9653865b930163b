package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/internal/pghorizon"
)

// conditionsView is projection.Status.Condition in SQL, for operators: one row per projection
// (per version: a version a newer one replaced is retired).
// Like the status, it counts the event types recorded at registration (NULL: every type), and
// looks for them as projection/postgres's lag statement does (see there). The row of a
// partition of a partitioned projection (partition_count set) looks only at its partition's
// streams (inPartition); that filter cannot use the store's partition index (the count is a
// column), so the view of a partition may read the other partitions' events of its types
// after its position.
const conditionsView = `CREATE OR REPLACE VIEW {conditions} AS
		WITH h AS MATERIALIZED (SELECT {horizon} AS xmin)
		SELECT p.name, CASE
				WHEN EXISTS (SELECT 1 FROM {versions} v WHERE v.unit = p.name AND v.state = 'retired') THEN 'retired'
				WHEN p.state = 'paused' THEN 'paused'
				WHEN p.state = 'failing' THEN 'failing'
				WHEN p.state = 'rebuilding' THEN 'rebuilding'
				WHEN (p.event_types IS NULL AND EXISTS (SELECT 1 FROM {events} e
						WHERE (e.transaction_id, e.global_position) > (p.transaction_id, p.global_position)
							AND e.transaction_id < (SELECT xmin FROM h) AND {inpart}))
					OR EXISTS (SELECT 1 FROM unnest(p.event_types) t(type) WHERE EXISTS (SELECT 1 FROM {events} e
						WHERE (e.event_type, e.transaction_id, e.global_position) > (t.type, p.transaction_id, p.global_position)
							AND (e.event_type, e.transaction_id) < (t.type, (SELECT xmin FROM h)) AND {inpart})) THEN 'working'
				WHEN (p.event_types IS NULL AND (SELECT max(e.transaction_id) FROM {events} e WHERE {inpart}) >= (SELECT xmin FROM h))
					OR EXISTS (SELECT 1 FROM unnest(p.event_types) t(type)
						WHERE (SELECT max(e.transaction_id) FROM {events} e WHERE e.event_type = t.type AND {inpart}) >= (SELECT xmin FROM h)) THEN 'held'
				ELSE 'caught_up' END AS condition,
			p.state, p.transaction_id, p.global_position, p.updated_at
		FROM {projections} p`

// inPartition is the condition of the conditions view that an event e is in the partition of
// the row p: always true for a projection that is not partitioned, else eventstore.PartitionOf
// in SQL (eventstore/postgres PartitionSQL) with the row's count.
const inPartition = `(p.partition_count IS NULL OR ((('x' || substr(md5(e.stream_id), 1, 8))::bit(32)::int & 2147483647) % p.partition_count) = p.partition_index)`

// conditionsMark starts the comment on the view nudge_projection_conditions; the rest is the
// hash of the statement that created it (conditionsVersion).
const conditionsMark = "nudge conditions view "

// replaceConditionsView creates or replaces the view nudge_projection_conditions in schema once
// the tables of both the event store and the projections exist. The view embeds the horizon
// expression of this version of the code: it is replaced when the hash of its statement, which
// its comment records, differs from this version's, and left alone otherwise, so that a
// Migrate with nothing to do runs no DDL (a role that does not own the view can run it).
// The caller's pgmigrate.Run took the migration lock.
func replaceConditionsView(ctx context.Context, tx pgx.Tx, schema string) error {
	table := func(name string) string {
		if schema == "" {
			return name
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	sql := strings.NewReplacer("{inpart}", inPartition, "{conditions}", table("nudge_projection_conditions"), "{projections}", table("nudge_projections"),
		"{events}", table("nudge_events"), "{versions}", table("nudge_projection_versions"), "{horizon}", pghorizon.Readable(schema)).Replace(conditionsView)
	mark := conditionsMark + conditionsVersion(sql)
	var (
		ready   bool
		comment *string
	)
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL
			AND EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($2) AND attname = 'partition_count' AND NOT attisdropped),
			obj_description(to_regclass($4), 'pg_class')`,
		table("nudge_events"), table("nudge_projections"), table("nudge_projection_versions"), table("nudge_projection_conditions")).Scan(&ready, &comment); err != nil {
		return fmt.Errorf("postgres: migrate: look for the tables of the view nudge_projection_conditions: %w", err)
	}
	if !ready || comment != nil && *comment == mark {
		return nil
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("postgres: migrate: replace view nudge_projection_conditions: %w", err)
	}
	if _, err := tx.Exec(ctx, `COMMENT ON VIEW `+table("nudge_projection_conditions")+` IS '`+mark+`'`); err != nil {
		return fmt.Errorf("postgres: migrate: mark view nudge_projection_conditions: %w", err)
	}
	return nil
}

// conditionsVersion is the hash of the statement that creates the view.
func conditionsVersion(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return hex.EncodeToString(sum[:8])
}
