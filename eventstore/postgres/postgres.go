// Package postgres is the PostgreSQL event store, on pgx/v5.
//
// Events live in the table nudge_events, one row per event, and streams in nudge_streams; create
// them with Store.Migrate, or all of nudge's tables at once with the driver core's
// postgres.Migrate (package github.com/nudgeworks/nudge/postgres). Appending locks the
// stream's row, so writers of one stream queue up while writers of different streams run in
// parallel.
//
// # Never skipping an event
//
// Global positions come from a sequence when a row is inserted, but transactions commit in any
// order: a reader that takes "everything after global position P" misses the events of a
// transaction that was given a smaller position and committed after the reader passed it. This
// store records the writing transaction's id on every event, orders reads by (transaction_id,
// global_position) and returns only events of transactions older than the oldest transaction
// still running (the horizon). Nothing in flight can later appear behind such a reader, and no
// gap timeout is needed.
//
// The price: a long-running writing transaction anywhere in the PostgreSQL cluster (it need not
// touch these tables) holds readers back until it ends. They wait; they never skip.
// Transactions that declare in their BEGIN that they append nothing (Store.ExemptTxOptions) do
// not count: projection/postgres exempts every projection batch, so a slow projection holds
// back neither the other projections nor the relay.
//
// # Order within a stream
//
// A transaction that was given its id by an earlier write and then appends to a stream after a
// younger transaction committed to the same stream would, in read order, put its event before
// the earlier version. AppendTx detects that case and returns an *eventstore.ConflictError with
// reason eventstore.ConflictStreamOrder: roll back and retry; the retry gets a newer id.
//
// # Partitioned reads
//
// A Read with ReadOptions.Partition {Index: i, Count: n} returns the events of the streams in
// partition i of n (eventstore.PartitionOf; in SQL, PartitionSQL(n), computed from stream_id),
// in read order and below the same horizon. Store.EnsurePartitions(ctx, n) builds the index it
// reads, (PartitionSQL(n), transaction_id, global_position), concurrently and once for every
// process; the read then walks that partition's range of the index from the position to the
// horizon and stops at the page's end, reading no event of another partition. Without the
// index the read is still correct, but it scans other partitions' events.
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/pgmigrate"
	"github.com/nudgeworks/nudge/internal/storecheck"
	"github.com/nudgeworks/nudge/postgres"
)

// querier is the part of DB and pgx.Tx that reads use.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AppendAttemptsDefault is how often Store.Append runs an append that hits an
// eventstore.ErrConflict before it returns the conflict.
const AppendAttemptsDefault = 10

// Config configures a Store.
type Config struct {
	// Schema holds the store's tables. Defaults to "", which means the connection's
	// search_path (usually public). A schema name is lowercase letters, digits and _.
	Schema string
	// AppendAttempts is how often Append tries an append that conflicts with a concurrent one.
	// Defaults to AppendAttemptsDefault.
	AppendAttempts int
	// Limits bound each append (bytes per event, bytes and events per append); zero fields take
	// their defaults (eventstore.MaxEventBytesDefault, 1 MiB; MaxAppendBytesDefault, 16 MiB;
	// MaxAppendEventsDefault, 10,000). An append beyond them fails with eventstore.ErrTooLarge
	// before any SQL is sent.
	Limits eventstore.Limits
	// SessionConnect, if set, opens the connection EnsurePartitions builds an index on: it
	// holds a session advisory lock over several statements, so behind a connection pooler in
	// transaction mode (PgBouncer) it must reach PostgreSQL directly, e.g.
	// postgres.PoolConnect(directPool). The store closes it after the build. Defaults to a
	// connection of the pool New gets.
	SessionConnect postgres.ConnectFunc
}

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config or a database
// handle it cannot use; the message names the field and what to do. An error about Limits also
// carries the *eventstore.ValidationError values of eventstore.Limits.Validate.
var ErrInvalidConfig = errors.New("postgres event store: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.AppendAttempts = cmp.Or(cfg.AppendAttempts, AppendAttemptsDefault)
	cfg.Limits = cfg.Limits.WithDefaults()
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if err := postgres.ValidateSchema(cfg.Schema); err != nil {
		return fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	if cfg.AppendAttempts < 1 {
		return fmt.Errorf("%w: AppendAttempts %d: must be 1 or more (0 means %d)", ErrInvalidConfig, cfg.AppendAttempts, AppendAttemptsDefault)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Store is the PostgreSQL event store. It is safe for concurrent use.
type Store struct {
	db postgres.DB
	// sessionConnect is Config.SessionConnect.
	sessionConnect postgres.ConnectFunc
	schema         string
	attempts       int
	limits         eventstore.Limits
	sql            statements
	// pool is db when it is a pool: Append then runs on a connection of its own, and notifies
	// after its commit through notifier (nil otherwise).
	pool     acquirer
	notifier *notifier
	// partitions are the partitioned read statements, made per partition count.
	partitions *partitionStatements
	// floor is the highest transaction id of an event this store's horizon let it read.
	floor floor
}

var _ eventstore.Store = (*Store)(nil)

// New returns a store on db. It does not touch the database; call Migrate once at start-up.
func New(db postgres.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: New needs a database handle (a *pgxpool.Pool), got nil", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{db: db, sessionConnect: cfg.SessionConnect, schema: cfg.Schema, attempts: cfg.AppendAttempts, limits: cfg.Limits, sql: newStatements(cfg.Schema)}
	s.partitions = &partitionStatements{events: s.qualified("nudge_events"), readable: s.sql.horizon}
	if pool, pooled := db.(acquirer); pooled {
		// A notification after the commit runs beside the next appends, so it needs a pool; on
		// a single connection the NOTIFY stays in the append's transaction.
		s.pool, s.notifier = pool, &notifier{db: db, payload: cfg.Schema}
	}
	return s, nil
}

// Limits returns the limits the store applies to appends, defaults filled in.
func (s *Store) Limits() eventstore.Limits { return s.limits }

// tables are the tables Migrate creates.
var tables = []string{"nudge_events", "nudge_streams"}

// Migrate creates or upgrades the store's tables alone: postgres.Migrate with
// postgres.ComponentEvents in the store's schema (postgres.Migrate without components migrates
// every component's tables at once). It is safe to run at every start and from several
// processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	return s.translate(pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error { return s.MigrateTx(ctx, tx) }))
}

// MigrateTx is Migrate inside the caller's transaction.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	return s.translate(postgres.MigrateTx(ctx, tx, s.schema, postgres.ComponentEvents))
}

// Append implements eventstore.Store: it appends in a transaction of its own and retries an
// eventstore.ErrConflict up to Config.AppendAttempts times.
//
// Append is idempotent for events with IDs: if every event of the call is already stored as
// the same stream's consecutive events (a retry after a lost reply, say), it writes nothing and
// returns the stored events with AppendResult.Idempotent set, whatever the expected version.
func (s *Store) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	if err := storecheck.Append(streamID, expected, events, s.limits); err != nil {
		return eventstore.AppendResult{}, err
	}
	var res eventstore.AppendResult
	err := s.retryConflicts(ctx, func() error {
		var err error
		if s.pool != nil {
			res, err = s.appendPipelined(ctx, streamID, expected, events)
			return err
		}
		return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
			res, err = s.appendTx(ctx, tx, streamID, expected, events, s.notifier != nil)
			return err
		})
	})
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	if !res.Idempotent && s.notifier != nil {
		s.notifier.signal() // after the commit: see notifier
	}
	return res, nil
}

// RunInTx runs fn in a transaction and commits it if fn returns nil. When fn (or the commit)
// fails with an eventstore.ErrConflict, the transaction is rolled back and fn runs again in a
// new one, up to Config.AppendAttempts times in all, with a short random pause between. Use it
// for command handlers that call AppendTx, so a conflict is retried like Append retries it; fn
// must be safe to run more than once.
func (s *Store) RunInTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.retryConflicts(ctx, func() error { return pgx.BeginFunc(ctx, s.db, fn) })
}

// retryConflicts runs attempt (one transaction) until it does not fail with an
// eventstore.ErrConflict, up to Config.AppendAttempts times in all, with a short random pause
// between; it returns attempt's last error, translated.
func (s *Store) retryConflicts(ctx context.Context, attempt func() error) error {
	// Back off a little, with jitter, so two racing appenders do not race again.
	wait := backoff.Exponential{Initial: 3 * time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 1.5, Jitter: 0.6}
	for n := 1; ; n++ {
		err := s.translate(attempt())
		if err == nil {
			return nil
		}
		if !errors.Is(err, eventstore.ErrConflict) || n >= s.attempts {
			return err
		}
		if err := backoff.Sleep(ctx, wait.Next()); err != nil {
			return err
		}
	}
}

// AppendTx appends inside the caller's transaction, so a command handler can write its own rows
// and the events atomically. The events become readable when tx commits.
//
// It checks everything before it writes, so an error other than a database failure leaves tx
// untouched. On an eventstore.ErrConflict, roll tx back and run the whole transaction again. An
// exact repeat of an earlier append is idempotent as in Append.
func (s *Store) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	if tx == nil {
		return eventstore.AppendResult{}, &eventstore.ValidationError{Field: "tx", Index: -1, Reason: "nil transaction; use Append to append in a transaction of the store's own"}
	}
	if err := storecheck.Append(streamID, expected, events, s.limits); err != nil {
		return eventstore.AppendResult{}, err
	}
	res, err := s.appendTx(ctx, tx, streamID, expected, events, false)
	return res, s.translate(err)
}

// acquirer is a pool (a *pgxpool.Pool): Append then runs its transaction on a connection of
// its own, in two round trips.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// appendPipelined is Append's transaction in two round trips, where pgx.BeginFunc around
// appendTx takes four: BEGIN goes with the statements that lock the stream, COMMIT with the
// insert. An insert that fails makes the server skip the COMMIT queued behind it (a pipeline
// stops at its first error), so nothing commits unless every event was inserted; a transaction
// that did not commit is rolled back before its connection goes back to the pool.
func (s *Store) appendPipelined(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData) (eventstore.AppendResult, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	defer pc.Release() // a connection left inside a transaction is closed, not reused
	conn := pc.Conn()
	defer func() {
		if conn.PgConn().TxStatus() != 'I' { // not committed: refused, a repeat, or failed
			rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), notifyTimeout)
			defer cancel()
			_, _ = conn.Exec(rbCtx, "rollback")
		}
	}()
	return s.appendVia(ctx, conn, true, streamID, expected, events, s.notifier != nil)
}

// appendVia appends events through q in two round trips: the first locks the stream and looks
// for an earlier append of the same events, the second inserts them. With own, q is a
// connection and the append its own transaction: BEGIN is sent with the first round trip and
// COMMIT with the second. With deferNotify the store's NOTIFY trigger skips the transaction:
// the caller notifies after the commit.
func (s *Store) appendVia(ctx context.Context, q batchSender, own bool, streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData, deferNotify bool) (eventstore.AppendResult, error) {
	st, err := s.lockStream(ctx, q, own, streamID, events, deferNotify)
	if err != nil {
		return eventstore.AppendResult{}, err
	}
	if res, done, err := s.checkAppend(streamID, expected, events, st); done || err != nil {
		return res, err
	}
	var (
		batch pgx.Batch
		res   eventstore.AppendResult
	)
	s.queueInsert(&batch, streamID, st.version, events, &res)
	if own {
		batch.Queue("commit")
	}
	if err := q.SendBatch(ctx, &batch).Close(); err != nil {
		return eventstore.AppendResult{}, conflictOn(err, streamID)
	}
	return res, nil
}

// checkAppend decides, from what the stream's lock found, whether an append can insert: done
// with the earlier result when it repeats an earlier append, an error when the expected
// version or the stream's order forbids it.
func (s *Store) checkAppend(streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData, st lockedStream) (eventstore.AppendResult, bool, error) {
	if len(st.found) > 0 {
		if err := storecheck.Repeat(streamID, events, st.found); err != nil {
			return eventstore.AppendResult{}, true, err
		}
		return eventstore.AppendResult{Events: st.found, StreamVersion: st.found[len(st.found)-1].StreamVersion, Idempotent: true}, true, nil
	}
	if !expected.Check(st.version) {
		return eventstore.AppendResult{}, true, &eventstore.WrongExpectedVersionError{StreamID: streamID, Expected: expected, Actual: st.version}
	}
	if st.exists && st.lastTx > st.ownTx {
		return eventstore.AppendResult{}, true, &eventstore.ConflictError{StreamID: streamID, Reason: eventstore.ConflictStreamOrder}
	}
	return eventstore.AppendResult{}, false, nil
}

// appendTx appends events in tx (see appendVia).
func (s *Store) appendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData, deferNotify bool) (eventstore.AppendResult, error) {
	return s.appendVia(ctx, tx, false, streamID, expected, events, deferNotify)
}

// lockedStream is what an append learns in its first round trip.
type lockedStream struct {
	exists  bool
	version int64
	lastTx  uint64 // the transaction of the stream's last append
	ownTx   uint64 // the append's own transaction
	exempt  bool   // the transaction is exempt from the horizon
	// found are stored events with the IDs of the events to append.
	found []eventstore.Event
}

// batchSender sends a pipelined batch: a transaction, or a connection.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// lockStream locks the stream's row (if the stream exists) and reads its state and whether
// the transaction is exempt from the horizon (then it fails with ErrExempt); in the same round
// trip, it looks for stored events with the IDs of events. With begin, tx is a connection and
// the round trip begins its transaction first: that transaction cannot have declared the
// exemption, and the lock is not looked for.
func (s *Store) lockStream(ctx context.Context, tx batchSender, begin bool, streamID string, events []eventstore.EventData, deferNotifying bool) (lockedStream, error) {
	// IDs travel as [16]byte: pgx encodes those natively, while uuid.UUID would go through
	// its text form.
	var ids [][16]byte
	for _, e := range events {
		if e.ID != uuid.Nil {
			ids = append(ids, e.ID)
		}
	}
	var (
		st    lockedStream
		batch pgx.Batch
	)
	lock := s.sql.lockStream
	if begin {
		batch.Queue("begin")
		lock = s.sql.lockStreamOwn
	}
	batch.Queue(lock, streamID).QueryRow(func(row pgx.Row) error {
		var v *int64
		var last *uint64
		err := row.Scan(&st.exempt, &v, &last, &st.ownTx)
		if v != nil && last != nil {
			st.exists, st.version, st.lastTx = true, *v, *last
		}
		return err
	})
	if deferNotifying {
		batch.Queue(deferNotify)
	}
	if len(ids) > 0 {
		batch.Queue(s.sql.eventsByID, ids).Query(func(rows pgx.Rows) error {
			var err error
			st.found, err = collectEvents(rows, len(ids))
			return err
		})
	}
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		return st, err
	}
	if st.exempt {
		return st, fmt.Errorf("append to %q: %w", streamID, ErrExempt)
	}
	return st, nil
}

// queueInsert queues on batch the insert of events as the stream's versions after version;
// when the batch is sent, *res holds them stored.
func (s *Store) queueInsert(batch *pgx.Batch, streamID string, version int64, events []eventstore.EventData, res *eventstore.AppendResult) {
	n := len(events)
	ids, types, payloads, metadata := insertColumns(events)
	batch.Queue(s.sql.insertEvents, streamID, version, ids, types, payloads, metadata).Query(func(rows pgx.Rows) error {
		*res = eventstore.AppendResult{Events: make([]eventstore.Event, 0, n), StreamVersion: version + int64(n)}
		for i := 0; rows.Next(); i++ {
			if i == n {
				return fmt.Errorf("postgres: append to %q returned more rows than the %d events it wrote", streamID, n)
			}
			e := eventstore.Event{
				ID:            ids[i],
				StreamID:      streamID,
				StreamVersion: version + int64(i) + 1,
				Type:          types[i],
				Payload:       events[i].Payload,
				Metadata:      events[i].Metadata,
			}
			if err := rows.Scan(&e.Position.GlobalPosition, &e.Position.TransactionID, &e.RecordedAt); err != nil {
				return err
			}
			res.Events = append(res.Events, e)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(res.Events) < n {
			return fmt.Errorf("postgres: append to %q wrote %d events, want %d", streamID, len(res.Events), n)
		}
		return nil
	})
}

// insertColumns returns the columns of the insert statement for events; an event without an ID
// gets a new UUIDv7.
func insertColumns(events []eventstore.EventData) (ids [][16]byte, types, payloads []string, metadata []*string) {
	n := len(events)
	ids, types, payloads, metadata = make([][16]byte, n), make([]string, n), make([]string, n), make([]*string, n)
	for i, e := range events {
		ids[i] = e.ID
		if e.ID == uuid.Nil {
			ids[i] = uuid.Must(uuid.NewV7())
		}
		types[i] = e.Type
		payloads[i] = string(e.Payload)
		if e.Metadata != nil {
			m := string(e.Metadata)
			metadata[i] = &m
		}
	}
	return ids, types, payloads, metadata
}

// ErrExempt is returned by AppendTx in a transaction exempt from the read horizon (see
// Store.ExemptTxOptions): readers do not wait for such a transaction, so events it appended
// could commit behind them. Nothing is written; append in another transaction.
var ErrExempt = errors.New("postgres: cannot append in a transaction exempt from the read horizon (a projection batch's, say: see Store.ExemptTxOptions); " +
	"append in a transaction of its own, or set projection.Config.AppendsEvents on a projection whose handlers append")

// ErrExemptTooLate is returned by Store.BeginExemptTx, and by the sent batch of
// Store.BeginExemptBatch, when the exemption is declared anywhere but as the first work of a
// top-level transaction: on a connection already inside a transaction (whose BEGIN PostgreSQL
// only warns about), inside a savepoint, or after another statement. Nothing was exempted, and
// the transaction is aborted: roll it back.
var ErrExemptTooLate = errors.New("postgres: the horizon exemption must be declared by a transaction's BEGIN, before any other statement and outside any savepoint " +
	"(Store.BeginExemptTx or BeginExemptBatch on a connection with no transaction open); nothing was exempted and the transaction is aborted: roll it back")

// txBeginner begins transactions: a *pgxpool.Pool or a *pgx.Conn.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// BeginExemptTx begins a transaction on db exempt from the horizon: db.BeginTx with
// ExemptTxOptions(opts), a refusal of the declaration returned as ErrExemptTooLate.
func (s *Store) BeginExemptTx(ctx context.Context, db txBeginner, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := db.BeginTx(ctx, s.ExemptTxOptions(opts))
	if err != nil {
		return nil, exemptRefused(err)
	}
	return tx, nil
}

// exemptRefused returns err, a failed declaration of the exemption, as an ErrExemptTooLate when
// the server refused it (active_sql_transaction, 25001: see statements' exemptGuard).
func exemptRefused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25001" {
		return fmt.Errorf("%w: %w", ErrExemptTooLate, err)
	}
	return err
}

// ExemptTxOptions returns opts changed so that a transaction begun with them (BeginTx on a
// *pgxpool.Pool or *pgx.Conn) declares, in its BEGIN, that it will append no events to the
// store, so readers need not wait for it: a long transaction that writes only other tables (a
// projection's batch writing its read model, say) then holds no reader of the store back.
// AppendTx in such a transaction fails with ErrExempt. The exemption ends with the transaction
// and holds for every store over the same events table.
//
// The exemption can only be declared by BEGIN, never later in a transaction or inside a
// savepoint: a transaction that may have appended already must hold readers back, and an
// exemption taken in a savepoint would end with a rollback to it while the transaction keeps
// its id, so a later append could commit behind readers that had passed it. PostgreSQL only
// warns about a BEGIN inside a transaction, so the declaration checks this itself: anywhere
// but as the first work of a top-level transaction (after a query, in a savepoint, on a
// connection whose transaction is running) it takes no exemption and fails with
// active_sql_transaction (25001), which aborts the transaction. BeginTx returns that
// *pgconn.PgError as it is; Store.BeginExemptTx returns it as ErrExemptTooLate.
//
// Readers find exempt transactions in pg_locks: each holds a shared advisory lock of class
// 1852340846 ("nhzn") keyed by the events table's OID. AppendTx looks there too and fails with
// ErrExempt whenever its backend holds that lock, however it was taken (by SQL, at session
// level, whatever the transaction's settings). Append's own transactions do not look: never
// take the lock at session level on a connection of the store's pool. opts.BeginQuery, when
// set, is kept as the first statement.
func (s *Store) ExemptTxOptions(opts pgx.TxOptions) pgx.TxOptions {
	begin := opts.BeginQuery
	if begin == "" {
		begin = beginSQL(opts)
	}
	opts.BeginQuery = begin + "; " + exemptGuard + "; " + s.sql.exempt
	return opts
}

// BeginExemptBatch begins batch's transaction with opts (pgx.Batch.BeginTx) and declares it
// exempt from the horizon, as ExemptTxOptions does, in the same round trip: the transaction's
// first statements are queued after it, and its pgx.Tx is the sent batch's BatchResults.Tx.
// The declaration is a prepared statement there, where ExemptTxOptions' BEGIN is parsed and
// planned anew by every transaction. batch must be empty (pgx panics otherwise), and
// opts.BeginQuery, if set, a single statement. A declaration that comes too late (see
// ExemptTxOptions) fails the sent batch with ErrExemptTooLate, and nothing queued after it
// runs.
func (s *Store) BeginExemptBatch(batch *pgx.Batch, opts pgx.TxOptions) {
	batch.BeginTx(opts)
	batch.Queue(exemptGuard).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		return exemptRefused(err)
	}
	batch.Queue(s.sql.exempt)
}

// beginSQL is the BEGIN statement pgx sends for opts without a BeginQuery.
func beginSQL(opts pgx.TxOptions) string {
	var b strings.Builder
	b.WriteString("BEGIN")
	if opts.IsoLevel != "" {
		b.WriteString(" ISOLATION LEVEL " + string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		b.WriteString(" " + string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		b.WriteString(" " + string(opts.DeferrableMode))
	}
	return b.String()
}

// HorizonSQL is an SQL expression of type xid8 (a scalar subquery) for the store's horizon as
// of the statement it is part of: events of transactions below it are readable, the others
// not yet. Queries that compute lag beside the store's own reads use it.
func (s *Store) HorizonSQL() string { return s.sql.horizon }

// Read implements eventstore.Store. It reads outside any transaction of the caller's; see
// ReadTx to read inside one.
func (s *Store) Read(ctx context.Context, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
	return s.read(ctx, s.db, after, opts)
}

// ReadTx is Read inside the caller's transaction; a projection uses it to read a batch in the
// transaction that also writes its read model and position.
//
// While tx holds a transaction id (it has written something), its own id is part of the horizon:
// events of transactions that started after it are left for a later read.
func (s *Store) ReadTx(ctx context.Context, tx pgx.Tx, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
	if tx == nil {
		return nil, &eventstore.ValidationError{Field: "tx", Index: -1, Reason: "nil transaction; use Read"}
	}
	return s.read(ctx, tx, after, opts)
}

func (s *Store) read(ctx context.Context, q querier, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
	limit, err := storecheck.ReadOptions(opts)
	if err != nil {
		return nil, err
	}
	if opts.Partition.Partitioned() {
		return s.readPartition(ctx, q, after, opts, limit)
	}
	var rows pgx.Rows
	if len(opts.Types) == 0 {
		rows, err = q.Query(ctx, s.sql.read[omit(opts)], after.TransactionID, after.GlobalPosition, limit, s.floor.get())
	} else {
		sql, types, sortless := s.readTypes(opts)
		args := []any{after.TransactionID, after.GlobalPosition, limit, types, s.floor.get()}
		if sortless {
			events, err := s.readSortless(ctx, q, sql, args, limit)
			return events, s.translate(err)
		}
		rows, err = q.Query(ctx, sql, args...)
	}
	if err != nil {
		return nil, s.translate(err)
	}
	events, err := collectEvents(rows, limit)
	s.floor.saw(events)
	return events, s.translate(err)
}

// QueueReadTx queues on batch the read ReadTx(ctx, tx, after, opts) would run, for a caller
// that sends batch in its transaction — after the statements that take its locks, say, so the
// read costs no round trip of its own. When batch is sent, done receives the events the read
// returned; a read that fails fails the batch instead. A read of several types queues the
// statements that turn sorting off for it and back (readTypesSQL). A read QueueReadTx cannot
// queue (invalid options, or a partition's, which may need a transaction of its own) is not
// queued: it returns false, and done is not called.
func (s *Store) QueueReadTx(batch *pgx.Batch, after eventstore.Position, opts eventstore.ReadOptions, done func([]eventstore.Event)) bool {
	limit, err := storecheck.ReadOptions(opts)
	if err != nil || opts.Partition.Partitioned() {
		return false
	}
	sql, args, sortless := s.sql.read[omit(opts)], []any{after.TransactionID, after.GlobalPosition, limit, s.floor.get()}, false
	if len(opts.Types) > 0 {
		var types any
		sql, types, sortless = s.readTypes(opts)
		args = []any{after.TransactionID, after.GlobalPosition, limit, types, s.floor.get()}
	}
	if sortless {
		batch.Queue(sortOff)
	}
	batch.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		events, err := collectEvents(rows, limit)
		if err != nil {
			return s.translate(err)
		}
		s.floor.saw(events)
		done(events)
		return nil
	})
	if sortless {
		batch.Queue(sortRestore)
	}
	return true
}

// omit indexes the read statements.
func omit(opts eventstore.ReadOptions) int {
	if opts.OmitPayload {
		return 1
	}
	return 0
}

// ReadStream implements eventstore.Store. Stream reads do not wait for the horizon: versions of
// one stream commit in order, so every committed version is returned.
func (s *Store) ReadStream(ctx context.Context, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error) {
	return s.readStream(ctx, s.db, streamID, afterVersion, limit)
}

// ReadStreamTx is ReadStream inside the caller's transaction (a projection's redrive of a
// parked stream reads it in its batch's transaction).
func (s *Store) ReadStreamTx(ctx context.Context, tx pgx.Tx, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error) {
	if tx == nil {
		return nil, &eventstore.ValidationError{Field: "tx", Index: -1, Reason: "nil transaction; use ReadStream"}
	}
	return s.readStream(ctx, tx, streamID, afterVersion, limit)
}

func (s *Store) readStream(ctx context.Context, q querier, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error) {
	if err := storecheck.StreamID(streamID); err != nil {
		return nil, err
	}
	limit, err := storecheck.Limit(limit)
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, s.sql.readStream, streamID, max(afterVersion, 0), limit)
	if err != nil {
		return nil, s.translate(err)
	}
	events, err := collectEvents(rows, min(limit, 64))
	return events, s.translate(err)
}

// Head implements eventstore.Store.
func (s *Store) Head(ctx context.Context) (eventstore.Position, error) {
	var p eventstore.Position
	err := s.db.QueryRow(ctx, s.sql.head, s.floor.get()).Scan(&p.TransactionID, &p.GlobalPosition)
	if errors.Is(err, pgx.ErrNoRows) {
		return eventstore.Position{}, nil
	}
	if err == nil {
		s.floor.raise(p.TransactionID)
	}
	return p, s.translate(err)
}

// collectEvents scans event rows; capacity is the expected number of rows.
func collectEvents(rows pgx.Rows, capacity int) ([]eventstore.Event, error) {
	defer rows.Close()
	events := make([]eventstore.Event, 0, capacity)
	for rows.Next() {
		var e eventstore.Event
		// The id scans as [16]byte and the JSON as []byte, which pgx copies natively (uuid.UUID
		// would go through text, json.RawMessage through json.Unmarshal).
		if err := rows.Scan(&e.Position.GlobalPosition, &e.Position.TransactionID, (*[16]byte)(&e.ID), &e.StreamID,
			&e.StreamVersion, &e.Type, (*[]byte)(&e.Payload), (*[]byte)(&e.Metadata), &e.RecordedAt); err != nil {
			return nil, err
		}
		events = append(events, e)
	}
	return events, rows.Err()
}

// conflictOn turns the errors a racing append causes into retryable conflicts.
func conflictOn(err error, streamID string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505", // unique_violation: another transaction created the stream or stored the ids first
			"40001", // serialization_failure (REPEATABLE READ or SERIALIZABLE callers)
			"40P01": // deadlock_detected
			return &eventstore.ConflictError{StreamID: streamID, Reason: eventstore.ConflictConcurrentAppend, Err: err}
		}
	}
	return err
}

// translate maps driver errors to the store's: a closed pool becomes eventstore.ErrClosed, a
// missing table of the store (undefined_table, 42P01: Migrate never ran on this database or
// schema) eventstore.ErrNotMigrated. Context errors keep matching context.Canceled and
// context.DeadlineExceeded.
func (s *Store) translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, puddle.ErrClosedPool) && !errors.Is(err, eventstore.ErrClosed) {
		return fmt.Errorf("%w: %w", eventstore.ErrClosed, err)
	}
	if pgmigrate.Missing(err, s.schema, tables...) && !errors.Is(err, eventstore.ErrNotMigrated) {
		return fmt.Errorf("%w: %w", eventstore.ErrNotMigrated, err)
	}
	return err
}

// Schema returns the schema the store's tables are in ("" for the search path).
func (s *Store) Schema() string { return s.schema }

// DB returns the database handle the store was created with. Components that keep their
// tables beside the store's (projection/postgres) work on it.
func (s *Store) DB() postgres.DB { return s.db }
