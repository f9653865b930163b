package nudge_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// BenchmarkAppendTracingOff: an in-memory client's Append with no TracerProvider set (the
// global no-op); compare its allocations with those before tracing existed.
func BenchmarkAppendTracingOff(b *testing.B) {
	benchmarkAppend(b, memoryClient(b, nudge.Config{}))
}

// memoryClient returns an in-memory client of cfg on a GoChannel, with one projection.
func memoryClient(b *testing.B, cfg nudge.Config) *nudge.Client {
	list, err := projection.New("ticket_list", projection.Config{},
		projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(b, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = ch.Close() })
	cfg.Channel, cfg.Projections = ch, []*projection.Projection{list}
	cfg.Logger = slog.New(slog.DiscardHandler)
	client, err := nudge.NewInMemory(cfg)
	require.NoError(b, err)
	return client
}

func benchmarkAppend(b *testing.B, client *nudge.Client) {
	benchmarkAppendCtx(context.Background(), b, client)
}

func benchmarkAppendCtx(ctx context.Context, b *testing.B, client *nudge.Client) {
	data := eventstore.EventData{Type: "TicketRegistered", Payload: []byte(`{"id":"1"}`)}
	b.ReportAllocs()
	for b.Loop() {
		_, err := client.Append(ctx, "ticket-1", eventstore.Any, data)
		require.NoError(b, err)
	}
}
