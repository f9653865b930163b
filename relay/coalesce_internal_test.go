package relay

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/trigger"
)

// TestCoalesceKeys: a trigger lists the distinct partition keys of its events' streams, sorted,
// runs of a stream and streams met again included once; more streams than trigger.MaxKeys list
// none (any stream).
func TestCoalesceKeys(t *testing.T) {
	t.Parallel()
	ev := func(stream string) eventstore.Event { return eventstore.Event{StreamID: stream, Type: "A"} }
	got := coalesce([]eventstore.Event{ev("a"), ev("a"), ev("b"), ev("a"), ev("b")})
	want := []uint32{eventstore.PartitionKey("a"), eventstore.PartitionKey("b")}
	slices.Sort(want)
	require.Equal(t, want, got.Keys)

	var many []eventstore.Event
	for i := range trigger.MaxKeys + 1 {
		many = append(many, ev(fmt.Sprintf("s-%d", i)))
	}
	require.Empty(t, coalesce(many).Keys, "more streams than MaxKeys: any stream")
	require.Len(t, coalesce(many[:trigger.MaxKeys]).Keys, trigger.MaxKeys)
}
