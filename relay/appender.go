package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/storecheck"
	"github.com/nudgeworks/nudge/trigger"
)

// TxPublisher publishes a trigger inside a PostgreSQL transaction, so the trigger commits or
// rolls back with it; channel/postgres is one.
type TxPublisher interface {
	PublishTx(ctx context.Context, tx pgx.Tx, t trigger.Trigger) error
}

// Appender appends events to the PostgreSQL store and publishes their trigger in the same
// transaction: if the append commits, so does the trigger, whatever happens to the process
// next. Use it with the PostgreSQL-queue channel; with other channels run a Relay instead.
type Appender struct {
	store *espg.Store
	pub   TxPublisher
	now   func() time.Time
}

// NewAppender returns an Appender on store publishing through pub.
func NewAppender(store *espg.Store, pub TxPublisher) (*Appender, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: NewAppender needs an event store (an *espg.Store) and a transactional publisher (channel/postgres)", ErrInvalidConfig)
	}
	return &Appender{store: store, pub: pub, now: time.Now}, nil
}

// AppendTx appends inside tx (see espg.Store.AppendTx) and publishes the trigger in tx. An
// idempotent repeat publishes nothing. On an error the caller rolls tx back.
func (a *Appender) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	res, err := a.store.AppendTx(ctx, tx, streamID, expected, events...)
	if err != nil || res.Idempotent {
		return res, err
	}
	if err := a.pub.PublishTx(ctx, tx, trigger.ForAppend(res, a.now().UTC())); err != nil {
		return eventstore.AppendResult{}, fmt.Errorf("relay: publish the append's trigger: %w", err)
	}
	return res, nil
}

// Append is AppendTx in a transaction of its own, retried on eventstore.ErrConflict like the
// store's Append.
func (a *Appender) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	if err := storecheck.Append(streamID, expected, events, a.store.Limits()); err != nil {
		return eventstore.AppendResult{}, err
	}
	var res eventstore.AppendResult
	err := a.store.RunInTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = a.AppendTx(ctx, tx, streamID, expected, events...)
		return err
	})
	return res, err
}
