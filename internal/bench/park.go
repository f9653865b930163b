package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

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
	none, parked, err := h.parkRounds(ctx, cfg)
	if err != nil {
		return err
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
		"latency is over the other %d streams' events only, %d appends/s from %d writers; both cases use OnFailure park; "+
		"%d interleaved rounds of each case, the round with the median p99 shown",
		poisonStream, cfg.streams-1, cfg.rate, cfg.writers, h.parkRoundCount())
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

// parkRoundCount is how many rounds of each case runPark interleaves: one with -quick, else 3
// (the machine's noise moves a single p99 by more than the 5 % the target allows).
func (h *harness) parkRoundCount() int {
	if h.opts.quick {
		return 1
	}
	return 3
}

// parkRounds runs the cases with no parked stream and with one, interleaved, and returns for
// each the round with the median p99.
func (h *harness) parkRounds(ctx context.Context, cfg liveConfig) (none, parked liveResult, err error) {
	var nones, parkeds []liveResult
	for range h.parkRoundCount() {
		cfg.poison = false
		res, err := h.runLive(ctx, cfg)
		if err != nil {
			return none, parked, fmt.Errorf("live with no parked stream: %w", err)
		}
		nones = append(nones, res)
		cfg.poison = true
		if res, err = h.runLive(ctx, cfg); err != nil {
			return none, parked, fmt.Errorf("live with one parked stream: %w", err)
		}
		parkeds = append(parkeds, res)
	}
	return medianP99(nones), medianP99(parkeds), nil
}

// medianP99 returns the result with the median p99.
func medianP99(rs []liveResult) liveResult {
	slices.SortFunc(rs, func(a, b liveResult) int { return cmp.Compare(a.latency.P99, b.latency.P99) })
	return rs[len(rs)/2]
}
