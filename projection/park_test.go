package projection

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// permanentErr marks itself permanent as retry.PermanentError does.
type permanentErr struct{ error }

func (permanentErr) Permanent() bool { return true }

// TestParkClassifiesErrors: outages never park a stream; permanent errors and undecodable
// payloads park at once; other errors after the attempts.
func TestParkClassifiesErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED},
		fmt.Errorf("insert: %w", syscall.ECONNRESET),
		&pgconn.PgError{Code: "08006", Message: "connection failure"},
		&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"},
		&pgconn.PgError{Code: "53300", Message: "too many connections"},
		fmt.Errorf("call: %w", context.DeadlineExceeded),
	} {
		require.True(t, IsOutage(err), "%v", err)
	}
	for _, err := range []error{
		&pgconn.PgError{Code: "22001", Message: "value too long for type character varying(25)"},
		errors.New("ticket not found"),
	} {
		require.False(t, IsOutage(err), "%v", err)
		require.False(t, permanent(err), "%v", err)
	}
	require.True(t, permanent(fmt.Errorf("wrapped: %w", permanentErr{errors.New("never")})))
	require.True(t, permanent(&DecodeError{EventType: "T", Target: "x", Err: errors.New("bad json")}))
}

// TestOnFailureConfig: defaults and refusals of the parking fields.
func TestOnFailureConfig(t *testing.T) {
	t.Parallel()
	cfg := Config{}.WithDefaults()
	require.Equal(t, OnFailureStop, cfg.OnFailure)
	require.Equal(t, MaxParkedStreamsDefault, cfg.MaxParkedStreams)
	require.Equal(t, ParkAfterAttemptsDefault, cfg.ParkAfterAttempts)
	require.NoError(t, cfg.Validate())
	bad := cfg
	bad.OnFailure = "skip"
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
	bad = cfg
	bad.MaxParkedStreams = -1
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
	bad = cfg
	bad.ParkAfterAttempts = -1
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
}
