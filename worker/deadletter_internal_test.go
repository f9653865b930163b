package worker

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
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
