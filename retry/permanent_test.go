package retry_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/retry"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, retry.Permanent(nil))
	require.False(t, retry.IsPermanent(nil))

	cause := errors.New("payload is not JSON")
	err := retry.Permanent(cause)
	require.True(t, retry.IsPermanent(err))
	require.ErrorIs(t, err, retry.ErrPermanent)
	require.ErrorIs(t, err, cause, "the mark unwraps to the marked error")
	require.Equal(t, "payload is not JSON", err.Error(), "the message is unchanged")

	var perr *retry.PermanentError
	require.ErrorAs(t, err, &perr)
	require.Same(t, cause, perr.Err)
	require.Same(t, cause, errors.Unwrap(err))

	wrapped := fmt.Errorf("handle order 7: %w", err)
	require.True(t, retry.IsPermanent(wrapped), "the mark survives wrapping")
	require.True(t, retry.IsPermanent(errors.Join(errors.New("other"), err)))

	require.False(t, retry.IsPermanent(cause))
	require.False(t, retry.IsPermanent(fmt.Errorf("wrapped: %w", cause)))
}
