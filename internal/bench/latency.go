package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/trigger"
)

// liveTargets are the p99 targets at 10 projections, per channel.
var liveTargets = map[string]Target{
	chAMQP:      {Name: "live p99, RabbitMQ, 10 projections", Op: AtMost, Threshold: 20, Unit: "ms"},
	chPostgres:  {Name: "live p99, PostgreSQL queue, 10 projections", Op: AtMost, Threshold: 30, Unit: "ms"},
	chGoChannel: {Name: "live p99, GoChannel, 10 projections", Op: AtMost, Threshold: 20, Unit: "ms"},
}

// targetPostgresOne: with one projection the PostgreSQL queue is not slower than with ten.
var targetPostgresOne = Target{Name: "live p99, PostgreSQL queue, 1 projection / 10 projections", Op: AtMost, Threshold: 1, Unit: "×"}

// latencyTargets lists every target the latency scenario checks.
func latencyTargets() []Target {
	ts := make([]Target, 0, len(channelKinds))
	for _, kind := range channelKinds {
		ts = append(ts, liveTargets[kind])
	}
	return append(ts, targetPostgresOne)
}

// liveTargetProjections is the projection count the live targets apply to.
const liveTargetProjections = 10

// latencyRun is one live run of the latency scenario: n projections; inTx: the PostgreSQL
// queue's triggers written in the appends' transactions, not by a relay; checkedFor: the
// target its p99 is checked against, if any.
type latencyRun struct {
	n          int
	inTx       bool
	label      string
	checkedFor Target
}

func runLatency(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["rate_per_s"], sec.Params["writers"], sec.Params["streams"] = sz.liveRate, sz.liveWriters, sz.liveStreams
	sec.Params["duration_s"], sec.Params["projections"] = sz.liveDuration.Seconds(), []int{1, 10}
	sec.Params["hop_rate_per_s"], sec.Params["hop_duration_s"], sec.Params["pg_poll_ms"] = sz.hopRate, sz.hopDuration.Seconds(), Ms(h.opts.pgPoll)
	sec.Params["relay_min_interval_ms"] = Ms(h.opts.relayInterval)
	table := &Table{Header: []string{"channel", "projections", "appends/s", "p50 ms", "p99 ms", "max ms", "staleness p50", "staleness p99", "agree",
		"hop p50", "hop p99", "p99 ratio"}}
	sec.table = table
	for _, kind := range channelKinds {
		label := channelLabels[kind]
		if kind == chPostgres {
			label += " (relay; woken, poll " + h.opts.pgPoll.String() + " while not listening)"
			if h.opts.noListen {
				label = channelLabels[kind] + fmt.Sprintf(" (relay; poll %s)", h.opts.pgPoll)
			}
		}
		hop, err := h.measureHop(ctx, kind, sz.hopRate, sz.hopDuration)
		if err != nil {
			return fmt.Errorf("%s hop: %w", label, err)
		}
		hopCase := label + " hop (publish→consume)"
		sec.AddMetric(Metric{Case: hopCase, Name: "p99_ms", Unit: "ms", Value: Ms(hop.P99), Extra: hop.Extra()})
		runs := []latencyRun{{n: 1, label: label}, {n: liveTargetProjections, label: label, checkedFor: liveTargets[kind]}}
		if kind == chPostgres {
			// The other wiring of the queue: each append writes its triggers and NOTIFY in its
			// own transaction, whose commits then take turns.
			runs = append(runs, latencyRun{n: liveTargetProjections, inTx: true, label: channelLabels[kind] + " (trigger in the append's transaction)"})
		}
		var p99One float64
		for _, run := range runs {
			n := run.n
			res, err := h.runLive(ctx, liveConfig{channel: kind, projections: n, rate: sz.liveRate, writers: sz.liveWriters,
				streams: sz.liveStreams, duration: sz.liveDuration, relayQueue: kind == chPostgres && !run.inTx})
			if err != nil {
				return fmt.Errorf("%s, %d projections: %w", run.label, n, err)
			}
			c := fmt.Sprintf("%s projections=%d", run.label, n)
			extra := res.latency.Extra()
			extra["appends_per_s"], extra["projections"] = res.appendsPerS, float64(n)
			extra["staleness_p50_ms"], extra["staleness_p99_ms"] = Ms(res.staleness.P50), Ms(res.staleness.P99)
			extra["staleness_count"] = float64(res.staleness.Count)
			agree := withinResolution(res.latency.P99, res.staleness.P99)
			extra["staleness_p99_agrees"] = map[bool]float64{false: 0, true: 1}[agree]
			m := Metric{Case: c, Name: "p99_ms", Unit: "ms", Value: Ms(res.latency.P99), Extra: extra}.WithBaseline(hopCase, Ms(hop.P99))
			sec.AddMetric(m)
			// The staleness histogram's quantiles beside the measurement, so the page shows both.
			sec.AddMetric(Metric{Case: c, Name: "staleness_p50_ms", Unit: "ms", Value: Ms(res.staleness.P50)}.
				WithBaseline(c+" p50_ms (measured)", Ms(res.latency.P50)))
			sec.AddMetric(Metric{Case: c, Name: "staleness_p99_ms", Unit: "ms", Value: Ms(res.staleness.P99)}.
				WithBaseline(c+" p99_ms (measured)", Ms(res.latency.P99)))
			table.Add(run.label, fmt.Sprint(n), FormatValue(res.appendsPerS, ""), FormatValue(Ms(res.latency.P50), "ms"),
				FormatValue(Ms(res.latency.P99), "ms"), FormatValue(Ms(res.latency.Max), "ms"),
				FormatValue(Ms(res.staleness.P50), "ms"), FormatValue(Ms(res.staleness.P99), "ms"), fmt.Sprint(agree),
				FormatValue(Ms(hop.P50), "ms"), FormatValue(Ms(hop.P99), "ms"), FormatValue(m.Ratio, "×"))
			h.log.InfoContext(ctx, "latency run done", slog.String("case", run.label), slog.Int("projections", n),
				slog.Float64("p50_ms", Ms(res.latency.P50)), slog.Float64("p99_ms", Ms(res.latency.P99)),
				slog.Float64("staleness_p50_ms", Ms(res.staleness.P50)), slog.Float64("staleness_p99_ms", Ms(res.staleness.P99)))
			if n == 1 {
				p99One = Ms(res.latency.P99)
			}
			if run.checkedFor.Name != "" {
				sec.AddCheck(run.checkedFor, c, Ms(res.latency.P99))
				if kind == chPostgres && m.Value > 0 {
					sec.AddCheck(targetPostgresOne, label, p99One/m.Value)
				}
			}
		}
	}
	sec.Note("latency: from an append's return to the commit of the projection batch that wrote the event (read model visible), every event × projection")
	sec.Note("staleness p50/p99: nudge_projection_event_staleness_seconds of the same events (recorded_at → batch commit, database clock), " +
		"summed over the projections and read as histogram_quantile does (linear within a bucket; buckets double from 1 ms, so within a factor of 2); " +
		"agree: the two p99s differ by at most the width of the bucket that holds the measured one")
	sec.Note("hop: the bare channel, a trigger published → consumed, %d/s, no projection; p99 ratio = live p99 / hop p99", sz.hopRate)
	return nil
}

// measureHop publishes triggers at rate for d to one subscription of a fresh channel of kind
// and measures publish → receive.
func (h *harness) measureHop(ctx context.Context, kind string, rate int, d time.Duration) (Latency, error) {
	f, err := h.newFixture(ctx, 4)
	if err != nil {
		return Latency{}, err
	}
	defer f.close()
	w, err := h.openChannel(ctx, f, kind, []string{"hop"})
	if err != nil {
		return Latency{}, err
	}
	defer w.close()
	sub, topic, err := w.ch.Subscriber("hop")
	if err != nil {
		return Latency{}, err
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		return Latency{}, err
	}
	var (
		mu      sync.Mutex
		samples []time.Duration
	)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for msg := range msgs {
			t, err := trigger.FromMessage(msg)
			if err == nil {
				mu.Lock()
				samples = append(samples, time.Since(t.At))
				mu.Unlock()
			}
			msg.Ack()
		}
	}()
	every := time.Second / time.Duration(rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	published := 0
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return Latency{}, ctx.Err()
		case <-tick.C:
		}
		if err := w.ch.Publish(ctx, trigger.Trigger{Reason: trigger.ReasonAppend, At: time.Now()}); err != nil {
			return Latency{}, fmt.Errorf("publish: %w", err)
		}
		published++
	}
	err = waitUntil(ctx, 30*time.Second, 5*time.Millisecond, "every trigger was consumed", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(samples) >= published, nil
	})
	cancel()
	select { // the subscription closes msgs when its context ends
	case <-consumed:
	case <-time.After(10 * time.Second):
	}
	if err != nil {
		return Latency{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	return Summarize(samples), nil
}
