// Package postgres keeps projection positions and status in PostgreSQL, in the event store's
// database and schema, and runs each batch as one transaction: read models written through the
// batch's transaction (projection.On handlers) are exactly-once.
//
// Status rows live in the table nudge_projections (create it with Backend.Migrate, or all of
// nudge's tables with the driver core's postgres.Migrate), one per projection, readable by
// operators with plain SQL. Each row also records the event types its projection handles
// (event_types, written by Register at every Runner.Init; NULL for every type), so StatusOf
// and Statuses compute a projection's status and lag from the database alone, without its
// definition: the operator CLI (cmd/nudge) does so.
//
// # Locking
//
// Every batch, and every change of a projection's status, first takes a transaction-scoped
// advisory lock keyed by the projection's name. That serialises all workers of one projection
// in every process: a second worker waits, then reads the position the first committed, so no
// event is handled twice and no work is duplicated. Unlike a row lock (SELECT … FOR UPDATE),
// the advisory lock gives the transaction no transaction id, so a catch-up that finds nothing to
// do writes nothing.
//
// # The store's horizon
//
// The store reads only below the oldest running transaction that may append events. Each
// batch declares right after its BEGIN that it appends none (espg.Store.BeginExemptBatch on a
// pool, where BEGIN, the declaration and the batch's lock go in one round trip, and its COMMIT
// with the position's advance; espg.Store.ExemptTxOptions elsewhere), so a batch
// that writes its read model and then takes its time (a slow handler, a flush to another
// service) holds back no other projection, nor the trigger relay. A handler
// that appends events in the batch's transaction gets espg.ErrExempt unless its projection
// sets projection.Config.AppendsEvents; such batches then hold back every reader of the store
// from their first write to their commit.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgmigrate"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/internal/seal"
)

// Backend is the PostgreSQL projection.Backend. It is safe for concurrent use.
type Backend struct {
	db postgres.DB
	// pool is db when it is a pool (nil otherwise): a batch then begins its transaction in
	// the round trip that takes its lock.
	pool       acquirer
	store      *espg.Store
	sql        statements
	partitions partitionLag
	// claimWait bounds a building version's wait for each lock of the active version it
	// claims past (claimWaitDefault).
	claimWait time.Duration
}

var _ projection.Backend = (*Backend)(nil)

// New returns a backend that reads events from store and keeps its tables on the store's
// database (espg.Store.DB), in the store's schema. Call Migrate once at start-up.
func New(store *espg.Store) (*Backend, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: projection/postgres.New needs an event store (an *espg.Store), got nil", projection.ErrInvalidConfig)
	}
	b := &Backend{db: store.DB(), store: store, sql: newStatements(store.Schema(), store.HorizonSQL()),
		partitions: newPartitionLag(store.Schema(), store.HorizonSQL()), claimWait: claimWaitDefault}
	b.pool, _ = b.db.(acquirer)
	return b, nil
}

// acquirer is a pool (a *pgxpool.Pool).
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Migrate creates or upgrades the status tables alone: postgres.Migrate with
// postgres.ComponentProjections in the store's schema (postgres.Migrate without components
// migrates every component's tables at once). Once the store's tables exist, it also creates
// the view nudge_projection_conditions, or replaces it if it embeds another version's horizon.
// It is safe to run at every start and from several processes at once.
func (b *Backend) Migrate(ctx context.Context) error {
	return b.inTx(ctx, func(tx pgx.Tx) error { return b.MigrateTx(ctx, tx) })
}

// MigrateTx is Migrate inside the caller's transaction.
func (b *Backend) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	return postgres.MigrateTx(ctx, tx, b.store.Schema(), postgres.ComponentProjections)
}

// readCommitted are the options of every transaction of the backend: every statement must see
// what the previous holder of the projection's lock committed, whatever the server's default
// isolation.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// inTx runs fn in a READ COMMITTED transaction.
func (b *Backend) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return b.inTxWith(ctx, readCommitted, fn)
}

// inTxWith runs fn in a transaction begun with opts.
func (b *Backend) inTxWith(ctx context.Context, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	tx, err := b.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return b.translate(err)
	}
	return b.translate(tx.Commit(ctx))
}

// tables are the tables and views Migrate creates; storeTables the event store's, which the
// backend's statements read too.
var (
	tables      = []string{"nudge_projections", "nudge_projection_skips", "nudge_projection_conditions", "nudge_projection_parked", "nudge_projection_park_actions", "nudge_projection_versions"}
	storeTables = []string{"nudge_events", "nudge_streams"}
)

// translate turns a missing table (Migrate never ran on this database or schema) into
// projection.ErrNotMigrated, or eventstore.ErrNotMigrated for the store's tables. A handler's
// error stays as it is, whatever table it names.
func (b *Backend) translate(err error) error {
	switch {
	case err == nil, errors.Is(err, projection.ErrHandler), errors.Is(err, projection.ErrNotMigrated), errors.Is(err, eventstore.ErrNotMigrated):
		return err
	case pgmigrate.Missing(err, b.store.Schema(), tables...):
		return fmt.Errorf("%w: %w", projection.ErrNotMigrated, err)
	case pgmigrate.Missing(err, b.store.Schema(), storeTables...):
		return fmt.Errorf("%w: %w", eventstore.ErrNotMigrated, err)
	}
	return err
}

// lock takes the projection's advisory lock and reads its status row, in one round trip.
func (b *Backend) lock(ctx context.Context, tx pgx.Tx, name string) (projection.Status, error) {
	return b.lockWith(ctx, tx, name, nil, nil, nil)
}

// lockWith is lock; when parked is not nil, it also reads the projection's parked streams into
// it, when ver is not nil its version record, and when ahead is not nil the events it
// describes: in the same round trip, but for the version record's full read (lockRead.finish).
func (b *Backend) lockWith(ctx context.Context, tx pgx.Tx, name string, parked map[string]projection.ParkedStream, ver *versionRead, ahead *readAhead) (projection.Status, error) {
	var (
		batch pgx.Batch
		st    projection.Status
	)
	read := b.queueLock(&batch, name, false, &st, parked, ver, ahead)
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		return st, err
	}
	return st, read.finish(ctx, tx)
}

// lockRead is the read of a unit's status and version record that queueLock queued after the
// unit's lock.
type lockRead struct {
	b    *Backend
	ver  *versionRead
	full bool // the version record needs the full read (selectBatchStatus), which finish makes
}

// queueLock queues on batch the statements of lockWith, which read the status into st when
// batch is sent; the caller then calls finish on what it returns. With async, the lock's
// statement also makes the transaction's commit asynchronous (batchMode).
//
// With a version record to read, the status comes from selectBatchStatus, which also says
// whether that record needs more than the state and the retirement it already holds: a
// projection with no other version building or waiting for its drop — nearly every batch —
// reads no more. When it does, finish reads the rest in a second round trip, still under the
// lock.
func (b *Backend) queueLock(batch *pgx.Batch, name string, async bool, st *projection.Status, parked map[string]projection.ParkedStream, ver *versionRead, ahead *readAhead) *lockRead {
	read := &lockRead{b: b, ver: ver}
	lock := b.sql.lock
	if async {
		lock = b.sql.lockAsync
	}
	batch.Queue(lock, name)
	if parked != nil {
		batch.Queue(b.sql.selectParkedOf, name).Query(func(rows pgx.Rows) error {
			list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (projection.ParkedStream, error) { return scanParked(row) })
			for _, ps := range list {
				parked[ps.StreamID] = ps
			}
			return err
		})
	}
	notRegistered := func(err error) error {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("projection %s: %w", name, projection.ErrNotRegistered)
		}
		return err
	}
	if ver == nil {
		batch.Queue(b.sql.selectStatus, name).QueryRow(func(row pgx.Row) error {
			var err error
			*st, _, err = scanStatus(row)
			return notRegistered(err)
		})
	} else {
		batch.Queue(b.sql.selectBatchStatus, name).QueryRow(func(row pgx.Row) error {
			var (
				dropped *time.Time
				err     error
			)
			if *st, _, err = scanStatusWith(row, &dropped, &read.full); err != nil {
				return notRegistered(err)
			}
			*ver.info = projection.VersionInfo{State: st.VersionState, RetiredAt: st.RetiredAt, DroppedAt: deref(dropped)}
			return nil
		})
	}
	ahead.queue(b.store, batch)
	return read
}

// finish reads the version record in full, its claims included, in one round trip on tx when
// the first round trip found it needs it; nothing (and no round trip) otherwise.
func (r *lockRead) finish(ctx context.Context, tx pgx.Tx) error {
	if !r.full {
		return nil
	}
	var batch pgx.Batch
	r.b.queueVersionInfo(&batch, r.ver)
	return tx.SendBatch(ctx, &batch).Close()
}

// readAhead is a batch's read run in the round trip that takes its lock (projection.ReadAhead).
type readAhead struct {
	want   *projection.ReadAhead
	queued bool // the store could queue the read
	used   bool // the unit's Read returned the events
	events []eventstore.Event
}

// newReadAhead returns the read-ahead of want; nil when want is nil.
func newReadAhead(want *projection.ReadAhead) *readAhead {
	if want == nil {
		return nil
	}
	return &readAhead{want: want}
}

// queue queues the read on batch, after the statements that lock and read the status.
func (r *readAhead) queue(store *espg.Store, batch *pgx.Batch) {
	if r == nil {
		return
	}
	r.queued = store.QueueReadTx(batch, r.want.After, r.want.Options, func(events []eventstore.Event) { r.events = events })
}

// take returns the events read ahead when a read after after with opts is that read, once.
func (r *readAhead) take(after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, bool) {
	if r == nil || !r.queued || r.used || !r.want.Matches(after, opts) {
		return nil, false
	}
	r.used = true
	return r.events, true
}

// Register implements projection.Backend. It also records the event types the projection
// handles (NULL for every type), so StatusOf can compute the lag without the definition; it
// writes them only when they changed. A database without the backend's tables is an error
// matching projection.ErrNotMigrated, one without the event store's tables an error matching
// eventstore.ErrNotMigrated.
func (b *Backend) Register(ctx context.Context, p *projection.Projection, init projection.HookFunc) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		var storeReady bool
		if err := tx.QueryRow(ctx, b.sql.eventsExist).Scan(&storeReady); err != nil {
			return err
		}
		if !storeReady {
			return fmt.Errorf("projection %s: %w", p.Name(), eventstore.ErrNotMigrated)
		}
		state, err := b.registerVersion(ctx, tx, p)
		if err != nil {
			return err
		}
		if err := b.checkPartitions(ctx, tx, p); err != nil {
			return err
		}
		if err := b.registerRows(ctx, tx, p); err != nil {
			return err
		}
		switch state {
		case projection.VersionRetired:
			return nil // a newer version replaced this one: its read model is not created again
		case projection.VersionBuilding:
			if err := b.adoptTables(ctx, tx, p); err != nil {
				return err
			}
		}
		if err := runHook(ctx, tx, init); err != nil {
			return viewRefused(p, "init", err)
		}
		if state == projection.VersionActive {
			return b.createViews(ctx, tx, p)
		}
		return nil
	})
}

// runHook runs the runner's hook, if any, in tx.
func runHook(ctx context.Context, tx pgx.Tx, hook projection.HookFunc) error {
	if hook == nil {
		return nil
	}
	return hook(ctx, tx)
}

// Seal implements projection.Backend.
func (*Backend) Seal(seal.Token) {}

// RunBatch implements projection.Backend.
func (b *Backend) RunBatch(ctx context.Context, p *projection.Projection, want *projection.ReadAhead, fn projection.BatchFunc) error {
	var (
		st     projection.Status
		parked = make(map[string]projection.ParkedStream)
		ver    projection.VersionInfo
		ahead  = newReadAhead(want)
	)
	var statements *projection.Statements // the handlers' statements left to the commit
	var read *lockRead
	mode := batchModeOf(p)
	queue := func(batch *pgx.Batch) {
		read = b.queueLock(batch, p.Name(), mode.async, &st, parked, versionOf(p, &ver), ahead)
	}
	err := b.inLockedTx(ctx, mode, queue, func(tx pgx.Tx) (*pgx.Batch, error) {
		if err := read.finish(ctx, tx); err != nil {
			return nil, err
		}
		u := b.unit(tx, st, parked, ver)
		u.Claim = func(ctx context.Context) (projection.VersionInfo, error) {
			err := b.claim(ctx, tx, p, &ver)
			return ver, err
		}
		if ahead != nil {
			read := u.Read
			u.Read = func(ctx context.Context, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
				if events, ok := ahead.take(after, opts); ok {
					return events, nil
				}
				return read(ctx, after, opts)
			}
		}
		out, err := fn(ctx, u)
		if err != nil {
			return nil, err
		}
		statements = out.Statements
		return b.outcome(p, st, out), nil
	})
	return statements.Failed(err)
}

// batchMode says how a batch's transaction runs.
type batchMode struct {
	exempt bool // exempt from the store's horizon (batchExempt)
	// async: committed with synchronous_commit = off (projection.Config.SynchronousCommit),
	// which the statement of the batch's lock sets (queueLock): the commit returns before its
	// WAL is flushed, which the WAL writer does within about three wal_writer_delay.
	async bool
}

// batchModeOf is the mode of p's batches: exempt unless p appends events, and committed
// asynchronously unless p appends events or asks for synchronous commits.
func batchModeOf(p *projection.Projection) batchMode {
	exempt := batchExempt(p)
	return batchMode{exempt: exempt, async: exempt && !p.Config().SynchronousCommit}
}

// inLockedTx runs fn in a READ COMMITTED transaction of mode: its first round trip sends the
// statements queue queued, its last the statements fn returned (nil: none). On a pool a
// connection of the pool runs the transaction, BEGIN goes in the first round trip and COMMIT
// in the last, and fn's transaction is closed before the COMMIT is sent (see batchTx);
// elsewhere BEGIN and COMMIT take round trips of their own.
func (b *Backend) inLockedTx(ctx context.Context, mode batchMode, queue func(*pgx.Batch), fn func(pgx.Tx) (*pgx.Batch, error)) error {
	if b.pool == nil {
		return b.inLockedTxOnDB(ctx, mode, queue, fn)
	}
	pc, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release() // a connection left inside a transaction is closed, not reused
	var batch pgx.Batch
	if mode.exempt {
		b.store.BeginExemptBatch(&batch, readCommitted)
	} else {
		batch.BeginTx(readCommitted)
	}
	queue(&batch)
	results := pc.Conn().SendBatch(ctx, &batch)
	tx := results.Tx()
	if err := results.Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx)) // ErrTxClosed when BEGIN itself failed
		return b.translate(err)
	}
	handlers := newBatchTx(tx)
	last, err := fn(handlers)
	handlers.close()
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return b.translate(err)
	}
	return b.translate(commitWith(ctx, tx, last))
}

// commitWith sends last and COMMIT in one round trip on tx, a transaction of a pool's
// connection, and rolls tx back if a statement of last failed. tx is left open in pgx's eyes
// after a commit: it must not be used again.
func commitWith(ctx context.Context, tx pgx.Tx, last *pgx.Batch) error {
	if last == nil {
		last = &pgx.Batch{}
	}
	last.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	err := tx.SendBatch(ctx, last).Close()
	if err != nil && tx.Conn().PgConn().TxStatus() != 'I' { // a statement before the COMMIT failed
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	return err
}

// inLockedTxOnDB is inLockedTx on a database that is not a pool (a connection, say): BEGIN and
// COMMIT take round trips of their own.
func (b *Backend) inLockedTxOnDB(ctx context.Context, mode batchMode, queue func(*pgx.Batch), fn func(pgx.Tx) (*pgx.Batch, error)) error {
	opts := readCommitted
	if mode.exempt {
		opts = b.store.ExemptTxOptions(opts)
	}
	return b.inTxWith(ctx, opts, func(tx pgx.Tx) error {
		var batch pgx.Batch
		queue(&batch)
		if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
			return err
		}
		last, err := fn(tx)
		if err != nil || last == nil || last.Len() == 0 {
			return err
		}
		return tx.SendBatch(ctx, last).Close()
	})
}

// batchExempt reports whether p's batch transactions are exempt from the store's horizon: unless p
// appends events.
func batchExempt(p *projection.Projection) bool { return !p.Config().AppendsEvents }

// batchOptions are the options of p's batch transactions (see batchExempt).
func (b *Backend) batchOptions(p *projection.Projection) pgx.TxOptions {
	if !batchExempt(p) {
		return readCommitted
	}
	return b.store.ExemptTxOptions(readCommitted)
}

// unit is the projection.Unit of a batch in tx.
func (b *Backend) unit(tx pgx.Tx, st projection.Status, parked map[string]projection.ParkedStream, ver projection.VersionInfo) projection.Unit {
	return projection.Unit{
		Tx:     tx,
		Status: st,
		Read: func(ctx context.Context, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error) {
			return b.store.ReadTx(ctx, tx, after, opts)
		},
		ReadStream: func(ctx context.Context, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error) {
			return b.store.ReadStreamTx(ctx, tx, streamID, afterVersion, limit)
		},
		Version: ver,
		Parked:  parked,
	}
}

// storeOutcome writes a batch's outcome (parking, skip, position) in one round trip; nothing
// when nothing changed.
func (b *Backend) storeOutcome(ctx context.Context, tx pgx.Tx, p *projection.Projection, st projection.Status, out projection.Outcome) error {
	batch := b.outcome(p, st, out)
	if batch.Len() == 0 {
		return nil
	}
	return out.Statements.Failed(tx.SendBatch(ctx, batch).Close())
}

// outcome returns the statements that write a batch's outcome (its handlers' statements not sent
// yet, parking, skip, position), none when nothing changed.
func (b *Backend) outcome(p *projection.Projection, st projection.Status, out projection.Outcome) *pgx.Batch {
	batch := &pgx.Batch{}
	out.Statements.AppendTo(batch) // the handlers' statements, before the position moves on
	if out.ChangesParking() {
		b.queueParking(batch, p.Name(), out)
	}
	if k := out.Skip; k != nil {
		batch.Queue(b.sql.recordSkip, p.Name(), [16]byte(k.Event.ID), k.Event.Type, k.Event.StreamID,
			k.Event.Position.TransactionID, k.Event.Position.GlobalPosition, k.By, k.Reason, k.Forced, k.At)
	}
	clock := out.CommitClock
	if out.Processed != 0 || out.Position != st.Position || out.State != st.State || out.ClearFailure {
		advance, advanceClock := b.sql.advance, b.sql.advanceClock
		if out.ClearFailure {
			advance, advanceClock = b.sql.advanceClearing, b.sql.advanceClearingClock
		}
		args := []any{p.Name(), out.Position.TransactionID, out.Position.GlobalPosition, out.Processed, string(out.State)}
		if clock == nil {
			batch.Queue(advance, args...)
			return batch
		}
		// The advance is the last statement before COMMIT, in its round trip: it returns the
		// batch's commit in the database's clock, the clock of the events' recorded_at.
		batch.Queue(advanceClock, args...).QueryRow(func(row pgx.Row) error { return row.Scan(clock) })
		return batch
	}
	if clock != nil {
		batch.Queue("SELECT clock_timestamp()").QueryRow(func(row pgx.Row) error { return row.Scan(clock) })
	}
	return batch
}

// RecordFailure implements projection.Backend.
func (b *Backend) RecordFailure(ctx context.Context, p *projection.Projection, f projection.Failure) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.lock(ctx, tx, p.Name()); err != nil {
			return err
		}
		e := f.Event
		_, err := tx.Exec(ctx, b.sql.recordFailure, p.Name(), e.Position.TransactionID, e.Position.GlobalPosition,
			[16]byte(e.ID), e.Type, e.StreamID, errorText(f.Err), f.At)
		return err
	})
}

// Reset implements projection.Backend. A partitioned projection's partitions are all reset in
// the one transaction, which takes their locks in index order; the hook runs once.
func (b *Backend) Reset(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.lockAll(ctx, tx, p); err != nil {
			return err
		}
		if err := runHook(ctx, tx, hook); err != nil {
			return viewRefused(p, "reset", err)
		}
		for _, u := range p.Units() {
			if _, err := tx.Exec(ctx, b.sql.clearParked, u.Name()); err != nil {
				return err // a rebuild handles every stream again
			}
			if _, err := tx.Exec(ctx, b.sql.reset, u.Name()); err != nil {
				return err
			}
		}
		return nil
	})
}

// SetState implements projection.Backend.
func (b *Backend) SetState(ctx context.Context, p *projection.Projection, to projection.State, from ...projection.State) (bool, error) {
	return b.SetStateBy(ctx, p, "", to, from...)
}

// SetStateBy implements projection.Backend.
func (b *Backend) SetStateBy(ctx context.Context, p *projection.Projection, by string, to projection.State, from ...projection.State) (bool, error) {
	var changed bool
	err := b.inTx(ctx, func(tx pgx.Tx) error {
		all, err := b.lockAll(ctx, tx, p)
		if err != nil {
			return err
		}
		for _, st := range all {
			ok, err := b.changeState(ctx, tx, st, by, to, from)
			if err != nil {
				return err
			}
			changed = changed || ok
		}
		return nil
	})
	return changed, err
}

// changeState sets the state of the locked unit st to to, unless it is in state to already or
// in none of from (when from is set); a change to or from paused records by and the time. It
// reports whether it changed.
func (b *Backend) changeState(ctx context.Context, tx pgx.Tx, st projection.Status, by string, to projection.State, from []projection.State) (bool, error) {
	if st.State == to || (len(from) > 0 && !slices.Contains(from, st.State)) {
		return false, nil
	}
	var err error
	if to == projection.StatePaused || st.State == projection.StatePaused {
		_, err = tx.Exec(ctx, b.sql.setStateBy, st.Name, string(to), by)
	} else {
		_, err = tx.Exec(ctx, b.sql.setState, st.Name, string(to))
	}
	return err == nil, err
}

// Delete implements projection.Backend. A partitioned projection's partitions are all deleted
// in the one transaction, which takes their locks in index order; the hook runs once.
func (b *Backend) Delete(ctx context.Context, p *projection.Projection, hook projection.HookFunc) error {
	return b.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.lockAll(ctx, tx, p); err != nil {
			return err
		}
		if err := runHook(ctx, tx, hook); err != nil {
			return viewRefused(p, "delete", err)
		}
		for _, u := range p.Units() {
			if _, err := tx.Exec(ctx, b.sql.clearParked, u.Name()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, b.sql.delete, u.Name()); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, b.sql.deleteVersion, p.Name())
		return err
	})
}

// Status implements projection.Backend. It reads the status row without waiting for a batch in
// flight, and computes the lag for the event types of p's definition.
func (b *Backend) Status(ctx context.Context, p *projection.Projection) (projection.Status, error) {
	st, _, err := b.statusRow(ctx, p.Name())
	if err != nil {
		return st, err
	}
	return b.withLag(ctx, st, rowInfo{types: p.Types(), part: p.Partition()})
}

// StatusOf returns the status of the projection called name, as Status does, without its
// definition: the lag counts the event types the projection handled when a Runner last
// registered it (Runner.Init), read from its status row. A row registered before those types
// were recorded (migration 0004) counts every type until its projection's next Init. A name
// with no status row is an error matching projection.ErrNotRegistered.
//
// The rows of a partitioned projection are per partition (named '<projection>.p<index>'):
// StatusOf and Statuses give each partition's status, its lag counted in its partition.
//
// The name of a partitioned projection itself (which has no row of its own) gives its
// partitions' statuses folded (projection.FoldPartitions), as Runner.Status does.
func (b *Backend) StatusOf(ctx context.Context, name string) (projection.Status, error) {
	st, info, err := b.statusRow(ctx, name)
	if errors.Is(err, projection.ErrNotRegistered) {
		return b.partitionedStatusOf(ctx, name, err)
	}
	if err != nil {
		return st, err
	}
	return b.withLag(ctx, st, info)
}

// Statuses returns the status of every projection that has a status row, sorted by name, as
// StatusOf computes it. It returns an empty slice when none is registered.
//
// What the projections share is read once per call, in one statement and one snapshot: the
// horizon, the head and the newest transaction of each event type. Projections at the same
// position with the same types share one lag window; each window is bounded as StatusOf's
// is. The transaction that holds the horizon is looked up at most once. Partitions keep a
// statement each (see partitionLag).
func (b *Backend) Statuses(ctx context.Context) ([]projection.Status, error) {
	all, err := b.statusRows(ctx)
	if err != nil {
		return nil, err
	}
	return b.statusesOfRows(ctx, all)
}

// StatusesOf returns the statuses of ps, in order, each as Status computes it (the lag for the
// event types of its definition), with what they share read once, as Statuses does: a
// Runner's statuses in a few statements instead of one per projection. A projection with no
// status row is an error matching projection.ErrNotRegistered.
func (b *Backend) StatusesOf(ctx context.Context, ps []*projection.Projection) ([]projection.Status, error) {
	all, err := b.statusRows(ctx)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]statusRowInfo, len(all))
	for _, r := range all {
		byName[r.st.Name] = r
	}
	rows := make([]statusRowInfo, len(ps))
	for i, p := range ps {
		r, ok := byName[p.Name()]
		if !ok {
			return nil, fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
		}
		r.info.types, r.info.part = p.Types(), p.Partition()
		rows[i] = r
	}
	return b.statusesOfRows(ctx, rows)
}

// statusesOfRows fills the lag fields of the status rows all, as Statuses describes.
func (b *Backend) statusesOfRows(ctx context.Context, all []statusRowInfo) ([]projection.Status, error) {
	out := make([]projection.Status, len(all))
	lags, err := b.lags(ctx, all)
	if err != nil {
		return nil, err
	}
	var holder *eventstore.HorizonHolder
	for i, r := range all {
		if r.info.part.Partitioned() {
			if out[i], err = b.withLag(ctx, r.st, r.info); err != nil { // a partition's lag: see partitionLag
				return nil, fmt.Errorf("projection %s: status: %w", r.st.Name, err)
			}
			continue
		}
		out[i] = lags[i].apply(r.st)
		if !out[i].HeldByHorizon {
			continue
		}
		if holder == nil {
			if out[i], err = b.holder(ctx, out[i]); err != nil {
				return nil, fmt.Errorf("projection %s: status: %w", r.st.Name, err)
			}
			holder = out[i].Holder
			continue
		}
		out[i].Holder = holder
	}
	return out, nil
}

// lagKey is what a projection's lag depends on besides the store: its position and types.
type lagKey struct {
	pos   eventstore.Position
	every bool   // every type
	types string // the types joined by NUL
}

// lags computes the lag of every row of all that is not a partition's, by index into all,
// with the lags statement: one window per distinct position and types.
func (b *Backend) lags(ctx context.Context, all []statusRowInfo) ([]lagRow, error) {
	positions, types, of := lagKeys(all)
	out := make([]lagRow, len(all))
	if len(positions) == 0 {
		return out, nil
	}
	xids := make([]uint64, len(positions))
	gps := make([]int64, len(positions))
	for i, p := range positions {
		xids[i], gps[i] = p.TransactionID, p.GlobalPosition
	}
	typesJSON, err := json.Marshal(types)
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: status: %w", err)
	}
	// The statement's cost estimate grows with the number of windows; past a few it crosses
	// jit_above_cost, and compiling it would take longer than running it (about a second
	// for 300 windows). SET LOCAL keeps that to this statement, PgBouncer's transaction mode
	// included.
	byKey := make([]lagRow, 0, len(positions))
	err = b.inTxWith(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var batch pgx.Batch
		batch.Queue(`SET LOCAL jit = off`)
		batch.Queue(b.sql.lags, xids, gps, typesJSON).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var l lagRow
				if err := l.scan(rows); err != nil {
					return err
				}
				byKey = append(byKey, l)
			}
			return rows.Err()
		})
		return tx.SendBatch(ctx, &batch).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: status: %w", err)
	}
	if len(byKey) != len(positions) {
		return nil, fmt.Errorf("projection/postgres: status: %d lag rows for %d positions", len(byKey), len(positions))
	}
	for i, r := range all {
		if !r.info.part.Partitioned() {
			out[i] = byKey[of[i]]
		}
	}
	return out, nil
}

// statusRowInfo is a status row (without lag fields) and what is recorded with it.
type statusRowInfo struct {
	st   projection.Status
	info rowInfo
}

// statusRows reads every status row, by name.
func (b *Backend) statusRows(ctx context.Context) ([]statusRowInfo, error) {
	rows, err := b.db.Query(ctx, b.sql.selectAllStatus)
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: read the status rows: %w", b.translate(err))
	}
	defer rows.Close()
	var all []statusRowInfo
	for rows.Next() {
		st, info, err := scanStatus(rows)
		if err != nil {
			return nil, fmt.Errorf("projection/postgres: read the status rows: %w", err)
		}
		all = append(all, statusRowInfo{st, info})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("projection/postgres: read the status rows: %w", b.translate(err))
	}
	return all, nil
}

// statusRow reads the status row of name and what is recorded with it.
func (b *Backend) statusRow(ctx context.Context, name string) (projection.Status, rowInfo, error) {
	st, info, err := scanStatus(b.db.QueryRow(ctx, b.sql.selectStatus, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return st, info, fmt.Errorf("projection %s: %w", name, projection.ErrNotRegistered)
	}
	return st, info, b.translate(err)
}

// withLag fills st's lag fields against the store, counting events of info.types (nil: every
// type) in info.part.
func (b *Backend) withLag(ctx context.Context, st projection.Status, info rowInfo) (projection.Status, error) {
	var l lagRow
	if info.part.Partitioned() {
		var err error
		if l, err = b.partitionLag(ctx, st.Position, info); err != nil {
			return st, b.translate(err)
		}
		return b.holder(ctx, l.apply(st))
	}
	if err := l.scan(b.db.QueryRow(ctx, b.sql.lag, st.Position.TransactionID, st.Position.GlobalPosition, info.types)); err != nil {
		return st, b.translate(err)
	}
	return b.holder(ctx, l.apply(st))
}

// lagKeys gives the distinct positions and types (nil: every type) of the rows of all that are
// not a partition's, and for each row of all the index of its key.
func lagKeys(all []statusRowInfo) (positions []eventstore.Position, types []any, of []int) {
	keys := make(map[lagKey]int)
	of = make([]int, len(all))
	for i, r := range all {
		if r.info.part.Partitioned() {
			continue
		}
		k := lagKey{pos: r.st.Position, every: r.info.types == nil, types: strings.Join(r.info.types, "\x00")}
		n, ok := keys[k]
		if !ok {
			n = len(positions)
			keys[k] = n
			positions = append(positions, r.st.Position)
			var t any // JSON null: every type
			if r.info.types != nil {
				t = r.info.types
			}
			types = append(types, t)
		}
		of[i] = n
	}
	return positions, types, of
}

// lagRow is a row of the lag statement.
type lagRow struct {
	head   eventstore.Position
	events int64    // in the window, at most lagWindow
	first  int64    // the window's first global position
	last   int64    // the window's last global position
	oldest *float64 // age in seconds of the window's first event
	held   bool
}

func (l *lagRow) scan(row pgx.Row) error {
	return row.Scan(&l.head.TransactionID, &l.head.GlobalPosition, &l.events, &l.first, &l.last, &l.oldest, &l.held)
}

// apply fills st's lag fields. A full window means more of the projection's events may
// follow it: the rest is estimated from the global positions after the window, at the density
// of its events within the window (first to last). Positions have gaps (rolled-back appends)
// and the mix of types changes, so the estimate is rough; it is exact again below lagWindow.
func (l lagRow) apply(st projection.Status) projection.Status {
	st.Head, st.LagEvents, st.HeldByHorizon = l.head, l.events, l.held
	st.LagTime = seconds(l.oldest)
	st.LagEstimated = l.events >= lagWindow
	if span := l.last - l.first; st.LagEstimated && span > 0 && l.head.GlobalPosition > l.last {
		st.LagEvents += int64(float64(l.head.GlobalPosition-l.last) * float64(l.events-1) / float64(span))
	}
	return st
}

// holder names the transaction that holds st's projection back, when it is held.
func (b *Backend) holder(ctx context.Context, st projection.Status) (projection.Status, error) {
	if !st.HeldByHorizon {
		return st, nil
	}
	h, err := b.store.HorizonHolder(ctx)
	if err != nil {
		return st, fmt.Errorf("look up the transaction that holds the horizon: %w", err)
	}
	st.Holder = h
	return st, nil
}

// errorText is the error as stored: at most 4 KiB.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return storedText(err.Error())
}

// storedText is an error's text as stored: without NUL bytes, at most 4 KiB.
func storedText(text string) string {
	const maxLen = 4096
	text = strings.ReplaceAll(text, "\x00", "")
	if len(text) > maxLen {
		text = strings.ToValidUTF8(text[:maxLen], "") + "…"
	}
	return text
}

// StartAttempt implements projection.Backend. It commits at once, on its own connection, so the
// count survives the death of the process running the batch.
//
// It needs a second connection while the batch holds one. If none is free within
// AttemptTimeout it returns projection.ErrAttemptNotRecorded rather than wait: with a pool
// smaller than the number of projections catching up at once, every batch could otherwise wait
// for another's connection. Give the pool more connections than projections.
func (b *Backend) StartAttempt(ctx context.Context, p *projection.Projection, at, careful eventstore.Position) (projection.Attempt, error) {
	var att projection.Attempt
	ctx, cancel := context.WithTimeout(ctx, AttemptTimeout)
	defer cancel()
	err := b.db.QueryRow(ctx, b.sql.startAttempt, p.Name(), at.TransactionID, at.GlobalPosition, !careful.IsZero(),
		careful.TransactionID, careful.GlobalPosition).Scan(&att.Starts, &att.CarefulUntil.TransactionID, &att.CarefulUntil.GlobalPosition)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return att, fmt.Errorf("projection %s: %w", p.Name(), projection.ErrNotRegistered)
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return att, fmt.Errorf("projection %s: %w within %s (is the pool smaller than the projections running at once?): %w",
			p.Name(), projection.ErrAttemptNotRecorded, AttemptTimeout, err)
	}
	return att, b.translate(err)
}

// AttemptTimeout bounds StartAttempt's wait for a connection and its update.
const AttemptTimeout = time.Second

// EndAttempt implements projection.Backend.
func (b *Backend) EndAttempt(ctx context.Context, p *projection.Projection, at *eventstore.Position) error {
	var tx *uint64
	var pos *int64
	if at != nil {
		tx, pos = &at.TransactionID, &at.GlobalPosition
	}
	_, err := b.db.Exec(ctx, b.sql.endAttempt, p.Name(), tx, pos)
	return b.translate(err)
}
