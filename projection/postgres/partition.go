package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// addPartitionSQL adds the statements of partitioned projections: a partition's registration
// and the partition count a projection's rows were registered with (1 for the row of an
// unpartitioned projection, 0 when it has none).
func (s *statements) addPartitionSQL(r *strings.Replacer) {
	s.registerPartition = r.Replace(`INSERT INTO {projections} AS p (name, event_types, partition_of, partition_index, partition_count)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (name) DO UPDATE SET event_types = EXCLUDED.event_types
		WHERE p.event_types IS DISTINCT FROM EXCLUDED.event_types`)
	s.partitionCount = r.Replace(`SELECT coalesce(
			(SELECT max(partition_count) FROM {projections} WHERE partition_of = $1),
			(SELECT 1 FROM {projections} WHERE name = $1 AND partition_of IS NULL),
			0)`)
}

// EnsurePartitions makes the event store's index for reads of count partitions ready
// (espg.Store.EnsurePartitions, outside any transaction: the index is built concurrently).
// Runner.Init calls it before it registers a partitioned projection.
func (b *Backend) EnsurePartitions(ctx context.Context, count int) error {
	return b.store.EnsurePartitions(ctx, count)
}

// checkPartitions refuses p, in tx holding p's lock, when its rows were registered with another
// partition count.
func (b *Backend) checkPartitions(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	var registered int
	if err := tx.QueryRow(ctx, b.sql.partitionCount, p.Name()).Scan(&registered); err != nil {
		return err
	}
	if registered != 0 && registered != p.Partitions() {
		return &projection.PartitionCountError{Projection: p.Name(), Registered: registered, Configured: p.Partitions()}
	}
	return nil
}

// registerRows creates or updates p's status rows: one per partition of a partitioned
// projection, its own otherwise.
func (b *Backend) registerRows(ctx context.Context, tx pgx.Tx, p *projection.Projection) error {
	if !p.Partitioned() {
		_, err := tx.Exec(ctx, b.sql.register, p.Name(), p.Types())
		return err
	}
	var batch pgx.Batch
	for _, u := range p.Units() {
		part := u.Partition()
		batch.Queue(b.sql.registerPartition, u.Name(), u.Types(), p.Name(), part.Index, part.Count)
	}
	return tx.SendBatch(ctx, &batch).Close()
}

// lockAll takes the locks of p's units in order (one per partition of a partitioned
// projection) and returns their status rows.
func (b *Backend) lockAll(ctx context.Context, tx pgx.Tx, p *projection.Projection) ([]projection.Status, error) {
	units := p.Units()
	out := make([]projection.Status, len(units))
	for k, u := range units {
		st, err := b.lock(ctx, tx, u.Name())
		if err != nil {
			return nil, err
		}
		out[k] = st
	}
	return out, nil
}

// partitionLag makes, per partition count, the lag statement of a partition: lag's, with the
// window and "held" read through the store's partition index (espg.PartitionSQL, built by
// EnsurePartitions), so the status of each of N partitions reads at most lagWindow of its own
// events, not the other partitions'.
type partitionLag struct {
	replacer *strings.Replacer
	mu       sync.Mutex
	byCount  map[int]string
}

func newPartitionLag(schema, horizon string) partitionLag {
	table := "nudge_events"
	if schema != "" {
		table = pgx.Identifier{schema, table}.Sanitize()
	}
	return partitionLag{replacer: strings.NewReplacer("{events}", table, "{horizon}", horizon, "{window}", fmt.Sprint(lagWindow))}
}

// forCount returns the lag statement of partitions of count; it takes the position ($1, $2),
// the types ($3, NULL for every type) and the partition index ($4).
func (l *partitionLag) forCount(count int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sql, ok := l.byCount[count]; ok {
		return sql
	}
	sql := strings.ReplaceAll(l.replacer.Replace(partitionLagSQL), "{part}", espg.PartitionSQL(count))
	if l.byCount == nil {
		l.byCount = make(map[int]string)
	}
	l.byCount[count] = sql
	return sql
}

// partitionLagSQL is the lag statement's shape for one partition. Like the store's partitioned
// reads, it compares the partition with = ANY and runs with sorting off (sortOff), so the only
// plan without a sort walks the partition index in read order from the position and stops
// after the window; "held" walks it backwards from the partition's newest event.
const partitionLagSQL = `WITH h AS MATERIALIZED (SELECT {horizon} AS xmin),
	head AS (
		SELECT e.transaction_id, e.global_position FROM {events} e
		WHERE e.transaction_id < (SELECT xmin FROM h) ORDER BY e.transaction_id DESC, e.global_position DESC LIMIT 1
	),
	win AS MATERIALIZED (
		SELECT e.transaction_id, e.global_position, e.recorded_at FROM {events} e
		WHERE {part} = ANY(ARRAY[$4::int]) AND (e.transaction_id, e.global_position) > ($1::xid8, $2::bigint)
			AND e.transaction_id < (SELECT xmin FROM h) AND ($3::text[] IS NULL OR e.event_type = ANY($3::text[]))
		ORDER BY {part}, e.transaction_id, e.global_position LIMIT {window}
	),
	lag AS (SELECT count(*) AS events, min(global_position) AS first, max(global_position) AS last, min(recorded_at) AS oldest FROM win),
	held AS (
		SELECT coalesce((SELECT e.transaction_id FROM {events} e
			WHERE {part} = ANY(ARRAY[$4::int]) AND ($3::text[] IS NULL OR e.event_type = ANY($3::text[]))
			ORDER BY {part} DESC, e.transaction_id DESC, e.global_position DESC LIMIT 1) >= (SELECT xmin FROM h), false) AS held
	)
	SELECT coalesce((SELECT transaction_id FROM head), '0'::xid8), coalesce((SELECT global_position FROM head), 0),
		lag.events, coalesce(lag.first, 0), coalesce(lag.last, 0), extract(epoch FROM clock_timestamp() - lag.oldest)::float8, held.held
	FROM lag, held`

// sortOff and sortRestore turn sorting off for the statement between them, transaction-locally
// (as the store's partitioned reads do).
const (
	sortOff     = `SELECT set_config('nudge.enable_sort', current_setting('enable_sort'), true), set_config('enable_sort', 'off', true)`
	sortRestore = `SELECT set_config('enable_sort', current_setting('nudge.enable_sort'), true)`
)

// partitionLag reads the lag of the partition info.part after position at, in a read-only
// transaction of its own.
func (b *Backend) partitionLag(ctx context.Context, at eventstore.Position, info rowInfo) (lagRow, error) {
	var l lagRow
	err := pgx.BeginTxFunc(ctx, b.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var batch pgx.Batch
		batch.Queue(sortOff)
		batch.Queue(b.partitions.forCount(info.part.Count), at.TransactionID, at.GlobalPosition, info.types, info.part.Index).
			QueryRow(func(row pgx.Row) error { return l.scan(row) })
		batch.Queue(sortRestore)
		return tx.SendBatch(ctx, &batch).Close()
	})
	return l, err
}

// partitionedStatusOf is StatusOf for the name of a partitioned projection: its partitions'
// statuses, folded. It returns notFound when name has no partitions.
func (b *Backend) partitionedStatusOf(ctx context.Context, name string, notFound error) (projection.Status, error) {
	rows, err := b.db.Query(ctx, b.sql.selectPartitionStatus, name)
	if err != nil {
		return projection.Status{}, b.translate(err)
	}
	var all []statusRowInfo
	for rows.Next() {
		st, info, err := scanStatus(rows)
		if err != nil {
			rows.Close()
			return projection.Status{}, err
		}
		all = append(all, statusRowInfo{st, info})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return projection.Status{}, b.translate(err)
	}
	if len(all) == 0 {
		return projection.Status{}, notFound
	}
	parts := make([]projection.Status, len(all))
	for k, r := range all {
		if parts[k], err = b.withLag(ctx, r.st, r.info); err != nil {
			return projection.Status{}, fmt.Errorf("partition %s: %w", r.st.Name, err)
		}
	}
	return projection.FoldPartitions(name, parts), nil
}
