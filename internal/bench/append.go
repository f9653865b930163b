package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
)

// targetAppendCost is the most trigger publishing may cost appends, at 10 events a transaction.
var targetAppendCost = Target{Name: "append throughput lost to trigger publishing, 10 events/tx", Op: AtMost, Threshold: 10, Unit: "%"}

const (
	// appendWriters append concurrently in every run.
	appendWriters = 8
	// appendProjections are declared on every channel: the PostgreSQL queue writes a row for
	// each of them per append.
	appendProjections = 10
	// appendStreamsPerWriter is how many streams each writer cycles through.
	appendStreamsPerWriter = 125
	// appendTargetSize is the events per transaction the target applies to.
	appendTargetSize = 10
)

// appendVariants are the ways appends run, the bare store without its NOTIFY first: it is the
// baseline, so every cost includes the notification that wakes the relays.
var appendVariants = []struct {
	label, kind string
	relay       bool // the PostgreSQL queue fed by a relay, not in the append's transaction
	noNotify    bool // the store's NOTIFY trigger disabled
}{
	{"bare store, no NOTIFY", "", false, true},
	{"bare store (NOTIFY after commit)", "", false, false},
	{"RabbitMQ (relay)", chAMQP, true, false},
	{"GoChannel (relay)", chGoChannel, true, false},
	{"PostgreSQL queue (relay)", chPostgres, true, false},
	{"PostgreSQL queue (in the append's tx)", chPostgres, false, false},
}

// appendTargets lists every target the append scenario checks.
func appendTargets() []Target {
	var ts []Target
	for _, v := range appendVariants[1:] {
		ts = append(ts, targetAppendCost.about(v.label))
	}
	return ts
}

// appendVariant is one way appends run: bare, or publishing triggers on a channel.
type appendVariant struct {
	label string
	kind  string // "" for the bare store
	f     *fixture
	w     *wiring
}

func runAppend(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sizes := []int{1, appendTargetSize}
	sec.Params["writers"], sec.Params["events_per_tx"], sec.Params["run_s"] = appendWriters, sizes, sz.appendRun.Seconds()
	sec.Params["rounds"], sec.Params["declared_projections"] = sz.appendRounds, appendProjections
	sec.Params["relay_min_interval_ms"] = Ms(h.opts.relayInterval)
	var projections []string
	for i := range appendProjections {
		projections = append(projections, fmt.Sprintf("append_%02d", i))
	}
	variants := make([]*appendVariant, len(appendVariants))
	for i, av := range appendVariants {
		v := &appendVariant{label: av.label, kind: av.kind}
		variants[i] = v
		f, err := h.newFixture(ctx, appendWriters+4)
		if err != nil {
			return err
		}
		defer f.close()
		v.f = f
		if av.noNotify {
			if _, err := f.db.pool.Exec(ctx, `ALTER TABLE nudge_events DISABLE TRIGGER nudge_events_notify`); err != nil {
				return fmt.Errorf("disable the store's NOTIFY: %w", err)
			}
		}
		if v.kind != "" {
			if v.w, err = h.openChannel(ctx, f, v.kind, projections); err != nil {
				return err
			}
			defer v.w.close()
			if av.relay {
				v.w.appender, v.w.store = nil, f.store
			}
		}
	}

	table := &Table{Header: []string{"case", "events/tx", "events/s", "runs", "baseline", "ratio", "cost"}}
	sec.table = table
	for _, size := range sizes {
		rates := make([][]float64, len(variants))
		// Rounds of every variant in turn, every other round backwards (ABCD DCBA): a noisy
		// spell hits all of them, and a drift along a round (the tables growing, a checkpoint)
		// favours none.
		for round := range sz.appendRounds {
			for j := range variants {
				i := j
				if round%2 == 1 {
					i = len(variants) - 1 - j
				}
				v := variants[i]
				rate, err := v.run(ctx, h, size, sz.appendRun)
				if err != nil {
					return fmt.Errorf("%s, %d events/tx: %w", v.label, size, err)
				}
				rates[i] = append(rates[i], rate)
				h.log.InfoContext(ctx, "append run done", slog.String("case", v.label), slog.Int("events_per_tx", size),
					slog.Int("round", round+1), slog.Float64("events_per_s", rate))
			}
		}
		bare := mean(rates[0])
		for i, v := range variants {
			m := Metric{Case: fmt.Sprintf("%s %d/tx", v.label, size), Name: "events_per_s", Unit: "events/s", Value: mean(rates[i]),
				Extra: map[string]float64{"events_per_tx": float64(size)}}
			for r, x := range rates[i] {
				m.Extra[fmt.Sprintf("run_%d", r+1)] = x
			}
			cost := ""
			if i > 0 {
				m = m.WithBaseline(fmt.Sprintf("%s %d/tx", variants[0].label, size), bare)
				m.Extra["cost_pct"] = 100 * (1 - m.Ratio)
				cost = FormatValue(m.Extra["cost_pct"], "%")
				if size == appendTargetSize {
					sec.AddCheck(targetAppendCost.about(v.label), fmt.Sprintf("mean of %d runs each", len(rates[i])), m.Extra["cost_pct"])
				}
			}
			sec.AddMetric(m)
			runs := ""
			for r, x := range rates[i] {
				if r > 0 {
					runs += " / "
				}
				runs += FormatValue(x, "")
			}
			baseline, ratio := "", ""
			if i > 0 {
				baseline, ratio = FormatValue(bare, ""), FormatValue(m.Ratio, "×")
			}
			table.Add(v.label, fmt.Sprint(size), FormatValue(m.Value, ""), runs, baseline, ratio, cost)
		}
	}
	sec.Note("%d writers, each cycling over %d streams; %d projections declared on every channel; no consumer runs", appendWriters, appendStreamsPerWriter, appendProjections)
	sec.Note("the relay runs only during its variant's runs, and finishes publishing before the next run starts; every other round runs the variants backwards; cost = 1 − ratio")
	sec.Note("the baseline has the store's NOTIFY disabled; the others notify: Append after its commit, coalesced; in the append's transaction (PostgreSQL queue) the events' and the queue's triggers, whose commits take turns; relays are woken by LISTEN unless -no-listen")
	return nil
}

// warm opens n connections of pool (if it has fewer) and puts them back idle.
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// run appends size events a transaction from appendWriters writers for d and returns events/s.
// With a relay, the relay runs meanwhile and publishes what was appended before run returns.
func (v *appendVariant) run(ctx context.Context, h *harness, size int, d time.Duration) (float64, error) {
	events := make([]eventstore.EventData, size)
	for i := range events {
		events[i] = eventstore.EventData{Type: rebuildEventType, Payload: []byte(ticketPayload(eventloadStream(i), i))}
	}
	var store interface {
		Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error)
	} = v.f.store
	var rel *relay.Relay
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	if v.w != nil {
		store = v.w.store
		if v.w.appender == nil {
			rcfg, err := h.relayConfig(v.f)
			if err != nil {
				return 0, err
			}
			if rel, err = relay.New(v.f.backend, v.w.ch, rcfg); err != nil {
				return 0, err
			}
			go func() { relayDone <- rel.Run(relayCtx) }()
		}
	}

	// Connections are opened before the clock starts and closed after the run: the four
	// variants' databases would otherwise hold dozens of idle connections on a shared server.
	if err := warm(ctx, v.f.db.pool, appendWriters); err != nil {
		return 0, err
	}
	defer v.f.db.resetPools()

	var (
		wg    sync.WaitGroup
		total atomic.Int64
		mu    sync.Mutex
		first error
	)
	started := time.Now()
	deadline := started.Add(d)
	for wr := range appendWriters {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if _, err := appendTraced(ctx, store, fmt.Sprintf("s-%d-%d", wr, i%appendStreamsPerWriter), events...); err != nil {
					mu.Lock()
					first = cmpOrErr(first, err)
					mu.Unlock()
					return
				}
				total.Add(int64(size))
			}
		})
	}
	wg.Wait()
	took := time.Since(started)
	if first != nil {
		return 0, first
	}
	if rel != nil {
		err := waitUntil(ctx, time.Minute, 10*time.Millisecond, "the relay published every append", func() (bool, error) {
			st, err := rel.Status(ctx)
			return err == nil && st.CaughtUp() && st.State == projection.StateRunning, err
		})
		stopRelay()
		if runErr := <-relayDone; err == nil && runErr != nil && !errors.Is(runErr, context.Canceled) {
			err = runErr
		}
		if err != nil {
			return 0, err
		}
	}
	return Rate(int(total.Load()), took), ctx.Err()
}
