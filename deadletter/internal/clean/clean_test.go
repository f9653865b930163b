package clean_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter/internal/clean"
)

func TestText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ok", clean.Text("ok"))
	require.Equal(t, "ab", clean.Text("a\x00b"))
	require.Equal(t, "a\uFFFDb", clean.Text("a\xff\xfeb"))
}

func TestTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2021, 1, 2, 3, 4, 5, 6789, time.FixedZone("X", 7200))
	require.Equal(t, time.Date(2021, 1, 2, 1, 4, 5, 6000, time.UTC), clean.Time(at))
	require.True(t, clean.Time(time.Time{}).IsZero())
}

func TestActor(t *testing.T) {
	t.Parallel()
	by, err := clean.Actor("by", "  ann\x00 ")
	require.NoError(t, err)
	require.Equal(t, "ann", by)
	_, err = clean.Actor("Resolve's by", " \x00 ")
	require.EqualError(t, err, `Resolve's by is empty: say who acts, e.g. an operator's name or "worker-start"; it is kept on the record`)
}
