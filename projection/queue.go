package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
)

// Queue collects the SQL statements that OnQueued handlers write for one batch. The runner
// sends them to PostgreSQL in one round trip (a pgx.Batch) inside the batch's transaction, after
// the batch's last handler and before the flush hook, so a read model written statement by
// statement costs one network round trip per batch instead of one per event. A projection
// without a flush hook sends them in the round trip that commits the batch, with the
// position's advance and COMMIT: its batch is then two round trips in all on a pool (the
// first begins the transaction, takes the lock and reads the events).
//
// A statement that fails is charged to the event whose handler queued it: the batch rolls back,
// the events before that one commit in a batch of their own, and the failure names that event,
// exactly as when an On handler returns an error.
type Queue struct {
	batch  pgx.Batch
	owners []int // owners[i] is the index, in the batch's events, of the event that queued statement i
	event  int   // index of the event being handled
}

// Queue adds a statement. Arguments are encoded when the queue is sent, so do not change a
// slice or map argument after queueing it.
func (q *Queue) Queue(sql string, args ...any) {
	q.batch.Queue(sql, args...)
	q.owners = append(q.owners, q.event)
}

// Len returns the number of statements queued.
func (q *Queue) Len() int { return len(q.owners) }

// OnQueued handles events of eventType for a read model in the event store's PostgreSQL
// database, like On, but fn does not execute SQL: it queues statements on q, and the runner
// sends a batch's statements in one round trip. Delivery is exactly-once, as with On: the
// statements run in the batch's transaction, which commits the position with them.
//
// Use it for handlers that only write (upserts, updates): a handler that needs to read what
// earlier events of the same batch wrote must use On. The payload is decoded into T with
// encoding/json; a payload that does not decode fails the event with a *DecodeError.
func OnQueued[T any](eventType string, fn func(ctx context.Context, q *Queue, e Event[T]) error) Handler {
	h := Handler{eventType: eventType, transactional: true}
	if fn == nil {
		return h
	}
	h.queued = func(ctx context.Context, q *Queue, e eventstore.Event) error {
		typedEvent := Event[T]{Event: e, Replay: Replaying(ctx)}
		if err := decode(eventType, e, &typedEvent.Data); err != nil {
			return err
		}
		return fn(ctx, q, typedEvent)
	}
	// Handled on its own (Projection.Handle: inline projections), the queue is sent at once.
	h.handle = func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
		if tx == nil {
			return fmt.Errorf("%w: an OnQueued handler needs the PostgreSQL backend", ErrNeedsTransaction)
		}
		var q Queue
		if err := h.queued(ctx, &q, e); err != nil {
			return err
		}
		if _, err := q.send(ctx, tx); err != nil {
			return err
		}
		return nil
	}
	return h
}

// send executes the queued statements in tx and empties the queue. When a statement fails it
// returns the index of the event that queued it and the statement's error.
func (q *Queue) send(ctx context.Context, tx pgx.Tx) (int, error) {
	if len(q.owners) == 0 {
		return 0, nil
	}
	owners := q.owners
	batch := &q.batch
	defer func() { q.batch, q.owners = pgx.Batch{}, nil }()
	results := tx.SendBatch(ctx, batch)
	for i, owner := range owners {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			return owner, statementError(i, err)
		}
	}
	if err := results.Close(); err != nil {
		return owners[len(owners)-1], fmt.Errorf("queued statements: %w", err)
	}
	return 0, nil
}

// Statements are the statements of a batch's OnQueued handlers that the runner leaves to the
// backend (Outcome.Statements), to be sent in the round trip that commits the batch, after the
// batch's last handler, when the projection has no flush hook that must see them first.
type Statements struct {
	q      Queue
	owners []int
	// fail charges err, the failure of a statement, to the event at index owner among the
	// batch's events and returns the batch's error.
	fail func(owner int, err error) error
	// ran counts the statements that ran; charged: a failure was charged to an event.
	ran     int
	charged bool
}

// AppendTo moves the statements onto b, in order. When b is sent, a statement that fails
// fails b with the *HandlerError of the event that queued it (errors.Is(err, ErrHandler)),
// and the batch then fails on that event as when the runner sends them: it rolls back, and
// the events before it commit in a batch of their own. The backend passes b's error through
// Failed.
func (s *Statements) AppendTo(b *pgx.Batch) {
	if s == nil {
		return
	}
	s.owners = s.q.owners
	for i, qq := range s.q.batch.QueuedQueries {
		qq.Fn = func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				s.charged = true
				return s.fail(s.owners[i], statementError(i, err))
			}
			s.ran++
			return nil
		}
		b.QueuedQueries = append(b.QueuedQueries, qq)
	}
	s.q = Queue{}
}

// Failed returns the error of the batch AppendTo filled: err as it is, unless the batch failed
// before every statement ran without a statement's own failure — one that could not be
// prepared or encoded fails the whole batch before any runs — which is charged, as when the
// runner sends them, to the event that queued the first statement that did not run.
func (s *Statements) Failed(err error) error {
	if s == nil || err == nil || s.charged || s.ran >= len(s.owners) {
		return err
	}
	s.charged = true
	return s.fail(s.owners[s.ran], statementError(s.ran, err))
}

// statementError is the failure of statement i (from 0) of a batch's queued statements.
func statementError(i int, err error) error {
	return fmt.Errorf("queued statement %d of the batch: %w", i+1, err)
}
