package postgres

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/projection"
)

// Parked implements projection.Backend.
func (b *Backend) Parked(ctx context.Context, p *projection.Projection) ([]projection.ParkedStream, error) {
	return b.ParkedStreams(ctx, ParkedFilter{Projection: p.Name()})
}

// ParkedFilter selects parked streams; empty fields match everything.
type ParkedFilter struct {
	Projection string
	StreamID   string
}

// ParkedStreams returns the parked streams filter selects, by projection and then oldest
// first, from the database alone (the operator CLI has no projection definitions).
func (b *Backend) ParkedStreams(ctx context.Context, filter ParkedFilter) ([]projection.ParkedStream, error) {
	rows, err := b.db.Query(ctx, b.sql.selectParked, nullable(filter.Projection), nullable(filter.StreamID))
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: read parked streams: %w", b.translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (projection.ParkedStream, error) { return scanParked(row) })
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: read parked streams: %w", b.translate(err))
	}
	return out, nil
}

// ParkActionFilter selects recorded actions on one projection's parked streams.
type ParkActionFilter struct {
	// Projection is the projection's name. Required.
	Projection string
	// StreamID, if set, selects one stream's actions.
	StreamID string
	// Limit is the most actions returned. Defaults to 10.
	Limit int
}

// ParkActions returns the recorded redrives, skips and purges of filter's parked streams,
// newest first: who unparked a stream, when, how and why (the operator CLI shows them for a
// stream found no longer parked).
func (b *Backend) ParkActions(ctx context.Context, filter ParkActionFilter) ([]projection.Unpark, error) {
	rows, err := b.db.Query(ctx, b.sql.selectParkActions, filter.Projection, nullable(filter.StreamID), cmp.Or(filter.Limit, 10))
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: read park actions: %w", b.translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (projection.Unpark, error) {
		var (
			u  projection.Unpark
			id [16]byte
		)
		err := row.Scan(&u.Stream.Projection, &u.Stream.StreamID, &u.Action, &id, &u.Stream.Event.Position.TransactionID,
			&u.Stream.Event.Position.GlobalPosition, &u.Stream.Held, &u.Stream.Error, &u.By, &u.Reason, &u.At)
		u.Stream.Event.ID, u.Stream.Event.StreamID = id, u.Stream.StreamID
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("projection/postgres: read park actions: %w", b.translate(err))
	}
	return out, nil
}

// Unpark removes parked streams of the projection called name without applying their parked
// events, under the projection's lock, and records action (projection.ParkActionSkip for one
// stream, projection.ParkActionPurge for every stream when streamID is "") with who and why.
// It is Runner.SkipParked and Runner.PurgeParked for tools without the projection's
// definition (no hook runs for them). It returns the unparked streams; a named stream that is
// not parked is an error matching projection.ErrNotParked.
func (b *Backend) Unpark(ctx context.Context, name, streamID string, action projection.ParkAction, by, reason string) ([]projection.ParkedStream, error) {
	if strings.TrimSpace(by) == "" || strings.TrimSpace(reason) == "" {
		return nil, fmt.Errorf("%w: unparking streams of projection %s needs who does it and a reason", projection.ErrInvalidConfig, name)
	}
	var done []projection.ParkedStream
	err := b.inTx(ctx, func(tx pgx.Tx) error {
		parked := make(map[string]projection.ParkedStream)
		if _, err := b.lockWith(ctx, tx, name, parked, nil, nil); err != nil {
			return err
		}
		var out projection.Outcome
		now := time.Now()
		for id, ps := range parked {
			if streamID == "" || id == streamID {
				out.Unpark = append(out.Unpark, projection.Unpark{Stream: ps, Action: action, By: by, Reason: reason, At: now})
				done = append(done, ps)
			}
		}
		if streamID != "" && len(done) == 0 {
			return fmt.Errorf("%w: projection %s, stream %q", projection.ErrNotParked, name, streamID)
		}
		return b.writeParking(ctx, tx, name, out)
	})
	return done, err
}

// writeParking writes out's changes to parked streams in tx, in one round trip.
func (b *Backend) writeParking(ctx context.Context, tx pgx.Tx, name string, out projection.Outcome) error {
	if !out.ChangesParking() {
		return nil
	}
	var batch pgx.Batch
	b.queueParking(&batch, name, out)
	return tx.SendBatch(ctx, &batch).Close()
}

// queueParking queues out's changes to parked streams on batch.
func (b *Backend) queueParking(batch *pgx.Batch, name string, out projection.Outcome) {
	if ps := out.Park; ps != nil {
		e := ps.Event
		batch.Queue(b.sql.insertParked, name, ps.StreamID, [16]byte(e.ID), e.Type, e.Position.TransactionID, e.Position.GlobalPosition,
			ps.StreamVersion, storedText(ps.Error), ps.Attempts, ps.ParkedAt)
	}
	for id, h := range out.Held {
		batch.Queue(b.sql.addHeld, name, id, h.Events, h.Last.TransactionID, h.Last.GlobalPosition)
	}
	for _, u := range out.Unpark {
		ps, e := u.Stream, u.Stream.Event
		batch.Queue(b.sql.deleteParked, name, ps.StreamID)
		batch.Queue(b.sql.recordParkAction, name, ps.StreamID, string(u.Action), [16]byte(e.ID), e.Position.TransactionID,
			e.Position.GlobalPosition, ps.Held, ps.Error, u.By, u.Reason, u.At)
	}
	if f := out.ParkFailed; f != nil {
		batch.Queue(b.sql.parkFailed, name, f.StreamID, errorText(f.Err))
	}
}

// nullable is s, or NULL when empty.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
