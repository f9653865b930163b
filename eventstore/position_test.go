package eventstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

func TestPositionOrder(t *testing.T) {
	t.Parallel()
	a := eventstore.Position{TransactionID: 10, GlobalPosition: 7}
	b := eventstore.Position{TransactionID: 10, GlobalPosition: 9}
	c := eventstore.Position{TransactionID: 11, GlobalPosition: 3}
	require.True(t, a.Less(b))
	require.True(t, b.Less(c), "the transaction id orders first, whatever the global position")
	require.False(t, c.Less(a))
	require.Equal(t, 0, a.Compare(a))
	require.True(t, eventstore.Position{}.Less(a))
	require.True(t, eventstore.Position{}.IsZero())
}

func TestPositionString(t *testing.T) {
	t.Parallel()
	p := eventstore.Position{TransactionID: 7414, GlobalPosition: 1203}
	require.Equal(t, "7414/1203", p.String())
	back, err := eventstore.ParsePosition(p.String())
	require.NoError(t, err)
	require.Equal(t, p, back)
	for _, bad := range []string{"", "7414", "a/1", "1/b", "1/-2", "-1/2", "1/2/3"} {
		_, err := eventstore.ParsePosition(bad)
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, bad)
		require.Contains(t, err.Error(), "transaction_id/global_position", bad)
	}
}

func TestExpectedVersion(t *testing.T) {
	t.Parallel()
	var zero eventstore.ExpectedVersion
	require.Equal(t, eventstore.Any, zero, "the zero value is Any")
	require.True(t, eventstore.Any.Check(0))
	require.True(t, eventstore.Any.Check(5))
	require.True(t, eventstore.NoStream.Check(0))
	require.False(t, eventstore.NoStream.Check(1))
	require.True(t, eventstore.Exact(3).Check(3))
	require.False(t, eventstore.Exact(3).Check(2))
	require.Equal(t, eventstore.NoStream.Check(0), eventstore.Exact(0).Check(0))
	require.Equal(t, "exactly 3", eventstore.Exact(3).String())
	require.ErrorIs(t, eventstore.Exact(-1).Validate(), eventstore.ErrInvalidInput)
}
