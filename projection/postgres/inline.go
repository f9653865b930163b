package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
)

// Inline appends events and applies inline projections to them in the same transaction: the
// read model is updated atomically with the append, and a handler's failure fails the append
// (the caller rolls the transaction back and nothing is written).
//
// Inline projections see exactly the events appended through Inline, in append order. They
// have no position and no status row, and they are not caught up by a Runner: events appended
// without Inline (with the store directly) never reach them. To rebuild an inline projection's
// read model from the store, run the same projection through a Runner (Reset, then CatchUp)
// while nothing appends through Inline.
type Inline struct {
	store       *espg.Store
	projections []*projection.Projection
}

// NewInline returns an Inline that appends to store and applies projections. A partitioned
// projection (Config.Partitions > 1) is refused with an error matching
// projection.ErrInvalidConfig: an inline projection runs in the append's transaction as one
// unit, with no position of its own, so there is nothing to split; run it through a Runner, or
// define it without Partitions.
func NewInline(store *espg.Store, projections ...*projection.Projection) (*Inline, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: NewInline needs an event store", projection.ErrInvalidConfig)
	}
	seen := map[string]bool{}
	for i, p := range projections {
		if p == nil {
			return nil, fmt.Errorf("%w: inline projection %d is nil", projection.ErrInvalidConfig, i)
		}
		if seen[p.Name()] {
			return nil, fmt.Errorf("%w: two inline projections are named %s", projection.ErrInvalidConfig, p.Name())
		}
		if p.Partitioned() {
			return nil, fmt.Errorf("%w: inline projection %s has Partitions %d: an inline projection runs in the append's transaction "+
				"as one unit, so it cannot be partitioned; leave Partitions at 1, or run the projection through a Runner",
				projection.ErrInvalidConfig, p.Name(), p.Partitions())
		}
		seen[p.Name()] = true
	}
	return &Inline{store: store, projections: projections}, nil
}

// AppendTx appends to the stream inside tx and runs every inline projection's handlers on the
// appended events with tx. On any error the caller must roll tx back. An idempotent repeat of
// an earlier append (eventstore.AppendResult.Idempotent) is not applied again.
func (in *Inline) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	res, err := in.store.AppendTx(ctx, tx, streamID, expected, events...)
	if err != nil || res.Idempotent {
		return res, err
	}
	for _, p := range in.projections {
		for _, e := range res.Events {
			if err := p.Handle(ctx, tx, e); err != nil {
				return eventstore.AppendResult{}, err
			}
		}
		if fn := p.Config().FlushFunc; fn != nil {
			if err := fn(ctx, projection.FlushParams{Projection: p.Name(), Tx: tx, Events: res.Events}); err != nil {
				return eventstore.AppendResult{}, fmt.Errorf("projection %s: flush hook: %w", p.Name(), err)
			}
		}
	}
	return res, nil
}

// Append is AppendTx in a transaction of its own, committed when everything succeeded, and
// retried on an eventstore.ErrConflict as the store's Append is (see espg.Store.RunInTx).
func (in *Inline) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	var res eventstore.AppendResult
	err := in.store.RunInTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = in.AppendTx(ctx, tx, streamID, expected, events...)
		return err
	})
	return res, err
}
