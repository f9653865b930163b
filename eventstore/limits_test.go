package eventstore_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

func TestLimitsDefaults(t *testing.T) {
	t.Parallel()
	l := eventstore.Limits{}.WithDefaults()
	require.Equal(t, eventstore.Limits{MaxEventBytes: 1 << 20, MaxAppendBytes: 16 << 20, MaxAppendEvents: 10_000}, l)
	require.NoError(t, l.Validate())
	require.Equal(t, 64<<20, eventstore.Limits{MaxEventBytes: 64 << 20}.WithDefaults().MaxAppendBytes,
		"a larger event limit raises the append's default with it")
}

func TestLimitsValidate(t *testing.T) {
	t.Parallel()
	err := eventstore.Limits{MaxEventBytes: -1, MaxAppendBytes: 10, MaxAppendEvents: 0}.Validate()
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
	require.ErrorContains(t, err, "Limits.MaxEventBytes: -1; it must be at least 1 (0 means 1048576)")
	require.ErrorContains(t, err, "Limits.MaxAppendEvents: 0")

	err = eventstore.Limits{MaxEventBytes: 100, MaxAppendBytes: 50, MaxAppendEvents: 1}.Validate()
	var ve *eventstore.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Limits.MaxAppendBytes", ve.Field)
	require.Contains(t, ve.Reason, "could never be appended")
}

func TestTooLargeError(t *testing.T) {
	t.Parallel()
	err := error(&eventstore.TooLargeError{Limit: eventstore.LimitEventBytes, Index: 2, Size: 3 << 19, Max: 1 << 20})
	require.True(t, errors.Is(err, eventstore.ErrTooLarge))
	require.True(t, errors.Is(err, eventstore.ErrInvalidInput))
	require.False(t, errors.Is(err, eventstore.ErrConflict))
	require.EqualError(t, err, "eventstore: append too large: events[2] holds 1572864 bytes (1.5 MiB) of payload and metadata, "+
		"above the limit of 1048576 bytes (1.0 MiB) (Limits.MaxEventBytes); nothing was written. "+
		"Keep large content elsewhere (a blob store, say) and put a reference in the event, or raise the store's Config.Limits.MaxEventBytes")

	err = &eventstore.TooLargeError{Limit: eventstore.LimitAppendBytes, Index: -1, Size: 17 << 20, Max: 16 << 20}
	require.ErrorContains(t, err, "17825792 bytes (17.0 MiB) of payloads and metadata in all")
	require.ErrorContains(t, err, "Append fewer events at a time")

	err = &eventstore.TooLargeError{Limit: eventstore.LimitAppendEvents, Index: -1, Size: 10_001, Max: 10_000}
	require.ErrorContains(t, err, "10001 events, above the limit of 10000 (Limits.MaxAppendEvents)")
}
