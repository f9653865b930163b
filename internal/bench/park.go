package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// targetParkedStream is how much one parked stream may raise the other streams' live p99.
var targetParkedStream = Target{Name: "one parked stream raises the other streams' live p99 by", Op: AtMost, Threshold: 5, Unit: "%"}

// poisonStream is the stream a poisoned live run fails on.
const poisonStream = "ticket-000"

// errPoisonStream is the poisoned stream's failure.
var errPoisonStream = errors.New("bench: poisoned stream")

// poisoned returns the flush error of a poisoned run for a batch with an event of
// poisonStream: it names the event, as a permanent error, so OnFailurePark parks the stream
// at once.
func (cfg liveConfig) poisoned(events []eventstore.Event) error {
	if !cfg.poison {
		return nil
	}
	for _, e := range events {
		if e.StreamID == poisonStream {
			return projection.FlushFailedOn(e, retry.Permanent(errPoisonStream))
		}
	}
	return nil
}

// runPark measures the other streams' live latency on RabbitMQ with one stream parked against
// none, side by side, both with OnFailure park.
func runPark(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	cfg := liveConfig{channel: chAMQP, projections: sz.slowLiveProjection, rate: sz.liveRate, writers: sz.liveWriters,
		streams: sz.liveStreams, duration: sz.slowLiveDuration, onFailure: projection.OnFailurePark}
	sec.Params["rate_per_s"], sec.Params["streams"], sec.Params["projections"] = cfg.rate, cfg.streams, cfg.projections
	sec.Params["duration_s"] = cfg.duration.Seconds()
	table := &Table{Header: []string{"case", "p50 ms", "p99 ms", "max ms", "p99 ratio"}}
	sec.table = table
	none, err := h.runLive(ctx, cfg)
	if err != nil {
		return fmt.Errorf("live with no parked stream: %w", err)
	}
	cfg.poison = true
	parked, err := h.runLive(ctx, cfg)
	if err != nil {
		return fmt.Errorf("live with one parked stream: %w", err)
	}
	noneCase := fmt.Sprintf("live, RabbitMQ, %d projections (park), no parked stream", cfg.projections)
	parkedCase := fmt.Sprintf("live, RabbitMQ, %d projections (park), 1 stream parked", cfg.projections)
	sec.AddMetric(Metric{Case: noneCase, Name: "p99_ms", Unit: "ms", Value: Ms(none.latency.P99), Extra: none.latency.Extra()})
	m := Metric{Case: parkedCase, Name: "p99_ms", Unit: "ms", Value: Ms(parked.latency.P99), Extra: parked.latency.Extra()}.
		WithBaseline(noneCase, Ms(none.latency.P99))
	sec.AddMetric(m)
	table.Add(noneCase, FormatValue(Ms(none.latency.P50), "ms"), FormatValue(Ms(none.latency.P99), "ms"), FormatValue(Ms(none.latency.Max), "ms"), "")
	table.Add(parkedCase, FormatValue(Ms(parked.latency.P50), "ms"), FormatValue(Ms(parked.latency.P99), "ms"),
		FormatValue(Ms(parked.latency.Max), "ms"), FormatValue(m.Ratio, "×"))
	sec.AddCheck(targetParkedStream, parkedCase, 100*(m.Ratio-1))
	h.log.InfoContext(ctx, "park run done", slog.Float64("p99_none_ms", Ms(none.latency.P99)), slog.Float64("p99_parked_ms", Ms(parked.latency.P99)))
	sec.Note("parked: every projection parks %s at its first event (its flush names it, a permanent error), then holds its later events; "+
		"latency is over the other %d streams' events only, %d appends/s from %d writers; both runs use OnFailure park",
		poisonStream, cfg.streams-1, cfg.rate, cfg.writers)
	return nil
}

// checkParked checks, after a poisoned run, that every measured projection parked exactly the
// poisoned stream.
func checkParked(ctx context.Context, runner *projection.Runner, cfg liveConfig) error {
	if !cfg.poison {
		return nil
	}
	for _, name := range runner.Names() {
		parked, err := runner.Parked(ctx, name)
		if err != nil {
			return fmt.Errorf("%s: parked streams: %w", name, err)
		}
		if len(parked) != 1 || parked[0].StreamID != poisonStream {
			return fmt.Errorf("%s: %d parked streams, want %s alone", name, len(parked), poisonStream)
		}
	}
	return nil
}
