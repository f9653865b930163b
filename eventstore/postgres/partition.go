package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/pghorizon"
)

// streamHashSQL is the stream hash of eventstore.PartitionOf in SQL: the first 32 bits of
// md5(stream_id) as a signed int. md5 is immutable, so the expression can be indexed; it hashes
// the text's bytes in the database encoding, which are the Go string's UTF-8 bytes in a UTF8
// (or SQL_ASCII) database.
const streamHashSQL = `('x' || substr(md5(stream_id), 1, 8))::bit(32)::int`

// PartitionSQL returns the SQL expression, over the events table's stream_id column (of the
// table in FROM, unqualified), for an event's partition among count partitions, the same as
// eventstore.PartitionOf: ((hash & 2147483647) % count). Queries beside the store's own
// (a projection's lag, say) that compare it with a partition index use the index that
// EnsurePartitions(ctx, count) creates when they write it exactly as returned. count must be 2
// to eventstore.MaxPartitions.
func PartitionSQL(count int) string {
	return `((` + streamHashSQL + ` & 2147483647) % ` + strconv.Itoa(count) + `)`
}

// partitionIndexName is the name of the index partitioned reads of count partitions use.
func partitionIndexName(count int) string {
	return "nudge_events_partition_" + strconv.Itoa(count) + "_idx"
}

// partitionLockClass is the first key of the session advisory lock that serialises the index
// builds of EnsurePartitions on one events table ("nprt"); the second is the table's OID.
const partitionLockClass = "1852863092"

// ErrPartitionEncoding reports a database whose encoding is neither UTF8 nor SQL_ASCII: there
// md5(stream_id) hashes other bytes than eventstore.PartitionOf, so the partitions of SQL and
// Go would disagree for stream ids outside ASCII. EnsurePartitions refuses such a database.
var ErrPartitionEncoding = errors.New("postgres: partitioned reads need a database with UTF8 (or SQL_ASCII) encoding, so that stream ids hash the same in SQL and in Go")

// partitionStatements are the partitioned read statements, made for each partition count when
// it is first read.
type partitionStatements struct {
	events   string // the qualified events table
	readable string // the horizon expression
	mu       sync.Mutex
	byCount  map[int]*partitionSQL
}

// partitionSQL are the statements of one partition count.
type partitionSQL struct {
	// read and readTypes are indexed by ReadOptions.OmitPayload (0: with payloads); they take
	// the position ($1, $2), the limit ($3), the partition index ($4), the types ($5, readTypes
	// only) and the store's floor (the last). head takes the partition index and the floor.
	read      [2]string
	readTypes [2]string
	head      string
}

func (p *partitionStatements) forCount(count int) *partitionSQL {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.byCount[count]; ok {
		return st
	}
	// Run with sorting off (see sortOff), the one plan without a sort is the range scan of
	// the partition index (partition, transaction_id, global_position) from the position to
	// the horizon, in read order: this partition's events alone.
	part := PartitionSQL(count)
	h := strings.NewReplacer("{readable}", p.readable, "{events}", p.events).Replace(horizon)
	full := strings.NewReplacer("{events}", p.events, "{columns}", eventColumns, "{horizon}", h, "{part}", part)
	bare := strings.NewReplacer("{events}", p.events, "{columns}", bareColumns, "{horizon}", h, "{part}", part)
	floor := func(sql, param string) string { return strings.ReplaceAll(sql, "{floor}", param) }
	st := &partitionSQL{
		read:      [2]string{floor(full.Replace(partitionReadSQL), "$5"), floor(bare.Replace(partitionReadSQL), "$5")},
		readTypes: [2]string{floor(full.Replace(partitionReadTypesSQL), "$6"), floor(bare.Replace(partitionReadTypesSQL), "$6")},
		head: floor(full.Replace(`SELECT transaction_id, global_position FROM {events} WHERE {part} = ANY(ARRAY[$1::int]) AND {horizon}
			ORDER BY {part} DESC, transaction_id DESC, global_position DESC LIMIT 1`), "$2"),
	}
	if p.byCount == nil {
		p.byCount = make(map[int]*partitionSQL)
	}
	p.byCount[count] = st
	return st
}

const partitionReadSQL = `SELECT {columns} FROM {events}
	WHERE {part} = ANY(ARRAY[$4::int]) AND (transaction_id, global_position) > ($1::xid8, $2::bigint) AND {horizon}
	ORDER BY {part}, transaction_id, global_position LIMIT $3`

const partitionReadTypesSQL = `SELECT {columns} FROM {events}
	WHERE {part} = ANY(ARRAY[$4::int]) AND (transaction_id, global_position) > ($1::xid8, $2::bigint) AND {horizon}
		AND event_type = ANY($5::text[])
	ORDER BY {part}, transaction_id, global_position LIMIT $3`

// The partitioned statements run with sorting disabled for the statement alone (set before
// it and restored after it, transaction-locally, in the same round trip): then the only plan
// without a sort is the walk of the partition index in read order, which stops at the page's
// end. Left to its estimates (the horizon is unknown when planning, so it guesses a third of
// the rows; near the end of the log it expects none), the planner would often fetch every
// event after the position through the partition index and sort them, or walk the read-order
// index and drop the other partitions' events: work that grows with the log, not the page.
// The ORDER BY leads with the partition and the partition condition is an = ANY, so the
// read-order index cannot give the order either.
const (
	sortOff     = `SELECT set_config('nudge.enable_sort', current_setting('enable_sort'), true), set_config('enable_sort', 'off', true)`
	sortRestore = `SELECT set_config('enable_sort', current_setting('nudge.enable_sort'), true)`
)

// readPartition is read for a partitioned opts.Partition, limit checked: in tx when q is one,
// else in a read-only transaction of its own.
func (s *Store) readPartition(ctx context.Context, q querier, after eventstore.Position, opts eventstore.ReadOptions, limit int) ([]eventstore.Event, error) {
	st := s.partitions.forCount(opts.Partition.Count)
	sql, args := st.read[omit(opts)], []any{after.TransactionID, after.GlobalPosition, limit, opts.Partition.Index}
	if len(opts.Types) > 0 {
		sql, args = st.readTypes[omit(opts)], append(args, opts.Types)
	}
	events, err := s.readSortless(ctx, q, sql, append(args, s.floor.get()), limit)
	return events, s.translate(err)
}

// readSortless runs the read sql with args and sorting off for it alone (sortOff): in tx when q
// is one, else in a read-only transaction of its own.
func (s *Store) readSortless(ctx context.Context, q querier, sql string, args []any, limit int) ([]eventstore.Event, error) {
	var events []eventstore.Event
	run := func(tx pgx.Tx) error {
		var batch pgx.Batch
		batch.Queue(sortOff)
		batch.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var err error
			events, err = collectEvents(rows, limit)
			s.floor.saw(events)
			return err
		})
		batch.Queue(sortRestore)
		return tx.SendBatch(ctx, &batch).Close()
	}
	if tx, ok := q.(pgx.Tx); ok {
		return events, run(tx)
	}
	return events, pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, run)
}

// HeadPartition is Head for one partition of the log: the position of the newest event of
// partition p that Read can return now (the zero Position when the partition has none). It
// uses the index of EnsurePartitions(ctx, p.Count). An unpartitioned p gives Head; an invalid
// one fails with a *eventstore.ValidationError.
func (s *Store) HeadPartition(ctx context.Context, p eventstore.Partition) (eventstore.Position, error) {
	if err := p.Validate(); err != nil {
		return eventstore.Position{}, err
	}
	if !p.Partitioned() {
		return s.Head(ctx)
	}
	var pos eventstore.Position
	err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var batch pgx.Batch
		batch.Queue(sortOff)
		batch.Queue(s.partitions.forCount(p.Count).head, p.Index, s.floor.get()).Query(func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				if err := rows.Scan(&pos.TransactionID, &pos.GlobalPosition); err != nil {
					return err
				}
			}
			return rows.Err()
		})
		batch.Queue(sortRestore)
		return tx.SendBatch(ctx, &batch).Close()
	})
	if err == nil {
		s.floor.raise(pos.TransactionID)
	}
	return pos, s.translate(err)
}

// EnsurePartitions makes sure the index that partitioned reads of count partitions use
// exists and is ready: (PartitionSQL(count), transaction_id, global_position) on the events
// table, named nudge_events_partition_<count>_idx. A partitioned projection calls it when it
// registers, before it reads; a count of 0 or 1 needs no index.
//
// The index is built with CREATE INDEX CONCURRENTLY, so appends and reads go on during the
// build (about a second per million events here); the call returns when the index is valid.
// It is idempotent and safe from many processes at once: the builds on one events table take
// turns under a session advisory lock, the other callers wait for the index to become valid,
// and a build left invalid by a crash is dropped and built again. It needs a connection pool
// (or a connection), not a transaction: CREATE INDEX CONCURRENTLY cannot run in one. A count
// outside [0, eventstore.MaxPartitions] fails with a *eventstore.ValidationError; a database
// whose encoding is not UTF8 with ErrPartitionEncoding.
//
// Each count in use costs an index the size of the read-order index, and every append
// writes to it; drop the index of a count no longer used with DROP INDEX CONCURRENTLY.
func (s *Store) EnsurePartitions(ctx context.Context, count int) error {
	if err := (eventstore.Partition{Count: count}).Validate(); err != nil {
		return err
	}
	if count <= 1 {
		return nil
	}
	wait := backoff.Exponential{Initial: 20 * time.Millisecond, Max: time.Second, Multiplier: 1.5, Jitter: 0.3}
	for {
		ready, err := s.partitionIndexReady(ctx, count)
		if err != nil || ready {
			return err
		}
		built, err := s.buildPartitionIndex(ctx, count)
		if err != nil {
			return fmt.Errorf("postgres: ensure the index of %d partitions: %w", count, s.translate(err))
		}
		if built {
			continue // check it, as a caller that waited would
		}
		if err := backoff.Sleep(ctx, wait.Next()); err != nil {
			return err
		}
	}
}

// partitionIndexReady reports whether the index of count partitions exists and is valid, and
// checks the database's encoding.
func (s *Store) partitionIndexReady(ctx context.Context, count int) (bool, error) {
	var (
		encoding string
		valid    *bool
	)
	err := s.db.QueryRow(ctx, `SELECT current_setting('server_encoding'),
			(SELECT i.indisvalid AND i.indisready FROM pg_index i WHERE i.indexrelid = to_regclass($1))`,
		s.qualified(partitionIndexName(count))).Scan(&encoding, &valid)
	if err != nil {
		return false, s.translate(err)
	}
	if encoding != "UTF8" && encoding != "SQL_ASCII" {
		return false, fmt.Errorf("%w (this one's is %s)", ErrPartitionEncoding, encoding)
	}
	return valid != nil && *valid, nil
}

// buildPartitionIndex builds the index of count partitions if no other caller is building an
// index on the events table; it reports whether it did. Holding the build lock, it drops an
// invalid index of that name, which a build that failed or was cancelled left.
func (s *Store) buildPartitionIndex(ctx context.Context, count int) (built bool, err error) {
	conn, release, err := s.session(ctx)
	if err != nil {
		return false, err
	}
	lockKey := partitionLockClass + `, (` + pghorizon.Key(s.schema) + `)::int4`
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lockKey+`)`).Scan(&locked); err != nil || !locked {
		release(err != nil)
		return false, err
	}
	defer func() {
		_, unlockErr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+lockKey+`)`)
		release(unlockErr != nil) // a connection that may still hold the lock is closed
		err = errors.Join(err, unlockErr)
	}()
	name := partitionIndexName(count)
	var invalid bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_index i WHERE i.indexrelid = to_regclass($1) AND NOT (i.indisvalid AND i.indisready))`,
		s.qualified(name)).Scan(&invalid); err != nil {
		return false, err
	}
	if invalid {
		if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+s.qualified(name)); err != nil {
			return false, err
		}
	}
	_, err = conn.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{name}.Sanitize()+` ON `+s.partitions.events+
		` (`+PartitionSQL(count)+`, transaction_id, global_position)`)
	return err == nil, err
}

// sessionConn is the part of a connection EnsurePartitions uses.
type sessionConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// session returns a connection of its own for session state (an advisory lock) and a release
// func that returns it to the pool, or closes it when broken is true: a direct one from
// Config.SessionConnect, closed at release, if set.
func (s *Store) session(ctx context.Context) (conn sessionConn, release func(broken bool), err error) {
	if s.sessionConnect != nil {
		direct, err := s.sessionConnect(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("SessionConnect: %w", err)
		}
		return direct, func(bool) { _ = direct.Close(context.WithoutCancel(ctx)) }, nil
	}
	pool, ok := s.db.(interface {
		Acquire(ctx context.Context) (*pgxpool.Conn, error)
	})
	if !ok { // a single connection is a session already
		return s.db, func(bool) {}, nil
	}
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return pooled, func(broken bool) {
		if broken {
			_ = pooled.Conn().Close(context.WithoutCancel(ctx))
		}
		pooled.Release()
	}, nil
}

// qualified returns name in the store's schema, quoted.
func (s *Store) qualified(name string) string {
	if s.schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{s.schema, name}.Sanitize()
}
