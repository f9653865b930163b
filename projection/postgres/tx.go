package postgres

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// batchTx is a batch's transaction as its handlers and hooks see it: the pgx.Tx of its
// connection until the batch ends it. A batch on a pool sends its COMMIT with its last
// statements, in one round trip, which leaves the pgx.Tx underneath open in pgx's eyes while its
// connection goes back to the pool: batchTx is closed first, so a handler that kept the
// transaction (a goroutine it started, say) gets pgx.ErrTxClosed from every method, as from a
// committed pgx.Tx, and never runs a statement on a connection that now serves someone else.
// Pseudo-nested transactions (Begin) close with it.
type batchTx struct {
	pgx.Tx
	closed *atomic.Bool
}

// newBatchTx returns tx as a batch's handlers see it.
func newBatchTx(tx pgx.Tx) *batchTx { return &batchTx{Tx: tx, closed: new(atomic.Bool)} }

// close closes t and every transaction begun in it.
func (t *batchTx) close() { t.closed.Store(true) }

// closedTx is a closed pgx.Tx of pgx's own: its methods return pgx.ErrTxClosed (or rows
// that do).
var closedTx = func() pgx.Tx {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(&b, pgx.ErrTxClosed).Tx()
}()

// tx is the transaction t's methods run on: closedTx once t is closed.
func (t *batchTx) tx() pgx.Tx {
	if t.closed.Load() {
		return closedTx
	}
	return t.Tx
}

func (t *batchTx) Begin(ctx context.Context) (pgx.Tx, error) {
	nested, err := t.tx().Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &batchTx{Tx: nested, closed: t.closed}, nil
}

func (t *batchTx) Commit(ctx context.Context) error   { return t.tx().Commit(ctx) }
func (t *batchTx) Rollback(ctx context.Context) error { return t.tx().Rollback(ctx) }

func (t *batchTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return t.tx().CopyFrom(ctx, table, columns, rows)
}

func (t *batchTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.tx().SendBatch(ctx, b)
}

func (t *batchTx) LargeObjects() pgx.LargeObjects { return t.tx().LargeObjects() }

func (t *batchTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.tx().Prepare(ctx, name, sql)
}

func (t *batchTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.tx().Exec(ctx, sql, args...)
}

func (t *batchTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.tx().Query(ctx, sql, args...)
}

func (t *batchTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.tx().QueryRow(ctx, sql, args...)
}

func (t *batchTx) Conn() *pgx.Conn { return t.tx().Conn() }
