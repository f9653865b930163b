package nudge_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// TestClientParkAndRedrive: the client's Parked and Redrive, on an in-memory client whose
// projection parks a stream.
func TestClientParkAndRedrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var broken atomic.Bool
	broken.Store(true)
	var handled sync.Map // ticket id → true; memory handlers are at-least-once
	count := func() int {
		n := 0
		handled.Range(func(any, any) bool { n++; return true })
		return n
	}
	list, err := projection.New("ticket_list", projection.Config{OnFailure: projection.OnFailurePark},
		projection.OnIdempotent("TicketRegistered", func(_ context.Context, e projection.Event[ticketRegistered]) error {
			if e.Data.Type == "bad" && broken.Load() {
				return retry.Permanent(errors.New("bad type"))
			}
			handled.Store(e.Data.ID, true)
			return nil
		}))
	require.NoError(t, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	client, err := nudge.NewInMemory(nudge.Config{Channel: ch, Projections: []*projection.Projection{list}, Logger: testlog.New(t)})
	require.NoError(t, err)
	require.NoError(t, client.Runner().Init(ctx))
	for i, typ := range []string{"bug", "bad", "bug"} {
		id := strconv.Itoa(i + 1)
		data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: id, Type: typ})
		require.NoError(t, err)
		_, err = client.Append(ctx, "ticket-"+id, eventstore.Any, data)
		require.NoError(t, err)
	}
	_, err = client.Runner().CatchUp(ctx, "ticket_list")
	require.NoError(t, err)
	require.Equal(t, 2, count())
	parked, err := client.Parked(ctx, "ticket_list")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "ticket-2", parked[0].StreamID)

	broken.Store(false)
	n, err := client.Redrive(ctx, "ticket_list", "", "test")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 3, count())
	st, err := client.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams)
}
