package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
)

// TestShouldDeadLetter: a handler's failure is dead-lettered after the retries, unless it is an
// outage — the handler's own connection dropped (as a database crash drops it: unexpected EOF),
// the server shutting down — which is nacked and comes back; outages are never dead-lettered.
func TestShouldDeadLetter(t *testing.T) {
	handler := func(err error) error { return &projection.HandlerError{Projection: "p", Err: err} }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{handler(errors.New("value too long for type character varying(20)")), true},
		{handler(&pgconn.PgError{Code: "22001"}), true},
		{fmt.Errorf("%w: bad bytes", trigger.ErrInvalid), true},
		{handler(io.ErrUnexpectedEOF), false},
		{handler(fmt.Errorf("upsert: %w", io.ErrUnexpectedEOF)), false},
		{handler(&pgconn.PgError{Code: "57P01"}), false},
		{handler(&pgconn.PgError{Code: "08006"}), false},
		{errors.New("database is down"), false},
	} {
		require.Equal(t, tc.want, shouldDeadLetter(tc.err), "%v", tc.err)
	}
}

// refusingStore is a dead-letter store whose Add fails while refuse is set, as a store whose
// database refuses connections does.
type refusingStore struct {
	deadletter.Store
	refuse atomic.Bool
}

func (r *refusingStore) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	if r.refuse.Load() {
		return deadletter.Record{}, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	}
	return r.Store.Add(ctx, e)
}

// TestDeadLetterFailureWaits: a trigger whose dead letter cannot be written waits before its
// nack (the error goes back to the subscriber, which redelivers it), a wait that doubles with
// each failure in a row up to deadLetterWaitMax and starts over once a dead letter is written.
// The waits go through the worker's sleep, so no time passes.
func TestDeadLetterFailureWaits(t *testing.T) {
	store := &refusingStore{Store: dlmemory.New(dlmemory.Config{})}
	var waits []time.Duration
	w := &Worker{cfg: Config{DeadLetters: store, DeadLetterTimeout: time.Second, TransientCauseFunc: TransientCause},
		logger: slog.New(slog.DiscardHandler), stats: map[string]*counters{"p": {}},
		sleepFunc: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}
	cause := retry.Permanent(errors.New("poison"))
	deadLetter := func() error {
		msg := message.NewMessage(watermill.NewUUID(), []byte("{}"))
		return w.deadLetter("p", msg, cause)
	}

	store.refuse.Store(true)
	for range 10 {
		require.Error(t, deadLetter(), "the dead letter is not written: the trigger is nacked")
	}
	require.Len(t, waits, 10, "every failed write waits before the nack")
	for i, d := range waits {
		want := min(deadLetterWaitInitial<<i, deadLetterWaitMax)
		require.InDelta(t, float64(want), float64(d), 0.2*float64(want)+1, "wait %d", i+1)
	}
	require.Equal(t, int64(10), w.stats["p"].deadLetterWaits.Load())

	store.refuse.Store(false)
	require.NoError(t, deadLetter())
	require.Len(t, waits, 10, "a written dead letter waits for nothing")
	store.refuse.Store(true)
	require.Error(t, deadLetter())
	require.InDelta(t, float64(deadLetterWaitInitial), float64(waits[10]), 0.2*float64(deadLetterWaitInitial)+1,
		"a written dead letter starts the waits over")
}
