package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

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

// poisonedProjection reports whether a poisoned run poisons the projection called name: the
// odd-numbered ones (live_01, live_03, …).
func poisonedProjection(name string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "live_"))
	return err == nil && n%2 == 1
}

// poisoned returns the handler error of a poisoned run for an event of poisonStream in a
// poisoned projection: a permanent error, so OnFailurePark parks the stream at once.
func (cfg liveConfig) poisoned(name string, e eventstore.Event) error {
	if cfg.poison && poisonedProjection(name) && e.StreamID == poisonStream {
		return retry.Permanent(errPoisonStream)
	}
	return nil
}

// warmPoisonStream appends the first event of poisonStream and waits until every projection
// has passed it: the poisoned ones have then failed on it and parked the stream before the
// measured appends start, so the run measures projections with a parked stream, not the
// batch that parked it (which their other streams wait for, once).
func warmPoisonStream(ctx context.Context, w *wiring, runner *projection.Runner) error {
	data, err := eventstore.NewEventData("TicketWasUpdated", livePayload{Writer: -1})
	if err != nil {
		return err
	}
	res, err := w.store.Append(ctx, poisonStream, eventstore.Any, data)
	if err != nil {
		return fmt.Errorf("append the first event of %s: %w", poisonStream, err)
	}
	at := res.Events[0].Position
	return waitUntil(ctx, time.Minute, 5*time.Millisecond, "every projection passed the first event of "+poisonStream,
		func() (bool, error) {
			for _, name := range runner.Names() {
				st, err := runner.Status(ctx, name)
				if err != nil || st.Position.Less(at) {
					return false, err
				}
			}
			return true, nil
		})
}

// runPark measures the other streams' live latency on RabbitMQ in projections with one stream
// parked against projections with none, side by side in the same runs: half the projections
// park poisonStream, the other half handle it, all under the same appends.
func runPark(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	cfg := liveConfig{channel: chAMQP, projections: sz.slowLiveProjection, rate: sz.liveRate, writers: sz.liveWriters,
		streams: sz.liveStreams, duration: max(sz.liveDuration/2, sz.slowLiveDuration), onFailure: projection.OnFailurePark, poison: true}
	sec.Params["rate_per_s"], sec.Params["streams"], sec.Params["projections"] = cfg.rate, cfg.streams, cfg.projections
	sec.Params["duration_s"], sec.Params["rounds"] = cfg.duration.Seconds(), h.parkRoundCount()
	table := &Table{Header: []string{"case", "p50 ms", "p99 ms", "max ms", "median projection p99 ms", "ratio"}}
	sec.table = table
	var clean, parked [][]time.Duration
	for range h.parkRoundCount() {
		res, err := h.runLive(ctx, cfg)
		if err != nil {
			return fmt.Errorf("live with one parked stream in half the projections: %w", err)
		}
		clean, parked = append(clean, res.clean...), append(parked, res.parked...)
	}
	half := cfg.projections / 2
	noneCase := fmt.Sprintf("live, RabbitMQ, %d projections (park) with no parked stream", cfg.projections-half)
	parkedCase := fmt.Sprintf("live, RabbitMQ, %d projections (park) with 1 stream parked", half)
	noneP99, oneP99 := addHalves(sec, table, targetParkedStream, noneCase, parkedCase, clean, parked)
	h.log.InfoContext(ctx, "park run done", slog.Float64("p99_none_ms", Ms(noneP99)), slog.Float64("p99_parked_ms", Ms(oneP99)))
	sec.Note("parked: in each run the odd-numbered projections park %s at its first event (their handler fails on it, a permanent error; "+
		"the park is over before the measured appends start) and hold its later events, while the even-numbered ones handle it; "+
		"latency is over the other %d streams' events only, %d appends/s from %d writers, all projections OnFailure park, side by side "+
		"under the same load; %d runs; p50, p99 and max pool each half's samples, the target compares the median of the projections' own p99s "+
		"(the pooled p99 is the worst projection's, which moves by ±15 %% from run to run on this machine with or without a parked stream)",
		poisonStream, cfg.streams-1, cfg.rate, cfg.writers, h.parkRoundCount())
	return nil
}

// checkParked checks, after a poisoned run, that every poisoned projection parked exactly the
// poisoned stream and the others none.
func checkParked(ctx context.Context, runner *projection.Runner, cfg liveConfig) error {
	if !cfg.poison {
		return nil
	}
	for _, name := range runner.Names() {
		parked, err := runner.Parked(ctx, name)
		if err != nil {
			return fmt.Errorf("%s: parked streams: %w", name, err)
		}
		switch {
		case !poisonedProjection(name) && len(parked) != 0:
			return fmt.Errorf("%s: %d parked streams, want none", name, len(parked))
		case poisonedProjection(name) && (len(parked) != 1 || parked[0].StreamID != poisonStream):
			return fmt.Errorf("%s: %d parked streams, want %s alone", name, len(parked), poisonStream)
		}
	}
	return nil
}

// addHalves reports the two halves of a side-by-side live run, base (the baseline's case) and
// test, their samples per projection: a table row and a metric each, the test's ratio to the
// base on the median of the projections' own p99s, checked against target. It returns both
// medians.
func addHalves(sec *Section, table *Table, target Target, baseCase, testCase string, base, test [][]time.Duration) (baseP99, testP99 time.Duration) {
	b, t := Summarize(slices.Concat(base...)), Summarize(slices.Concat(test...))
	baseP99, testP99 = medianP99(base), medianP99(test)
	sec.AddMetric(Metric{Case: baseCase, Name: "median_projection_p99_ms", Unit: "ms", Value: Ms(baseP99), Extra: b.Extra()})
	m := Metric{Case: testCase, Name: "median_projection_p99_ms", Unit: "ms", Value: Ms(testP99), Extra: t.Extra()}.WithBaseline(baseCase, Ms(baseP99))
	sec.AddMetric(m)
	table.Add(baseCase, FormatValue(Ms(b.P50), "ms"), FormatValue(Ms(b.P99), "ms"), FormatValue(Ms(b.Max), "ms"), FormatValue(Ms(baseP99), "ms"), "")
	table.Add(testCase, FormatValue(Ms(t.P50), "ms"), FormatValue(Ms(t.P99), "ms"), FormatValue(Ms(t.Max), "ms"), FormatValue(Ms(testP99), "ms"),
		FormatValue(m.Ratio, "×"))
	sec.AddCheck(target, testCase, 100*(m.Ratio-1))
	return baseP99, testP99
}

// parkRoundCount is how many runs runPark pools: one with -quick, else 3.
func (h *harness) parkRoundCount() int {
	if h.opts.quick {
		return 1
	}
	return 3
}

// medianP99 returns the median of the p99s of each projection's samples.
func medianP99(perProjection [][]time.Duration) time.Duration {
	p99s := make([]time.Duration, 0, len(perProjection))
	for _, samples := range perProjection {
		p99s = append(p99s, Summarize(samples).P99)
	}
	slices.Sort(p99s)
	if len(p99s) == 0 {
		return 0
	}
	return p99s[len(p99s)/2]
}
