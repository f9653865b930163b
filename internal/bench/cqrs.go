package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// The cqrs scenario sets nudge beside Watermill's own CQRS event processor, the first thing a
// Go user compares it with. Both write the same read model (activityProjection: one row per
// applied event) from the same events, on RabbitMQ and on the PostgreSQL queue:
//
//   - live: append commit → row committed, at 1,000 appends/s. The CQRS command side saves
//     the event in the store, then publishes it on the event bus ("save then publish"); the
//     processor's handler inserts the row and acks. nudge's relay (or, on the PostgreSQL
//     queue, the append's transaction) publishes a trigger and a per-event On handler inserts
//     the row in the batch's transaction.
//   - killed between the write and the ack: the consumer runs in a child process that
//     SIGKILLs itself right after a write committed (CQRS: the handler's insert; nudge: a
//     batch's commit) and before the ack; the next consumer takes over. Rows counted twice
//     are events applied twice; store events without a row are lost.
//   - the publish after the commit fails: the CQRS command side's publish fails for some
//     events after their append committed; nudge's relay's publish fails as many times.
//
// Every figure is counted from the databases: the store's events against the read model's rows.

// cqrsSizes are the scenario's sizes.
type cqrsSizes struct {
	rate, writers, streams int
	liveDuration           time.Duration
	faultEvents            int // appended in each fault run
	kills                  int // consumers SIGKILLed in a kill run
	failedPublishes        int // publishes that fail in a publish-failure run
}

func cqrsSizesFor(quick bool) cqrsSizes {
	s := cqrsSizes{rate: 1000, writers: 8, streams: 100, liveDuration: 3 * time.Second, faultEvents: 2000, kills: 3, failedPublishes: 10}
	if quick {
		s.liveDuration, s.faultEvents, s.kills, s.failedPublishes = time.Second, 600, 2, 5
	}
	return s
}

// targetCQRSFaults: nudge applies no event twice and loses none under the faults the CQRS
// processor is put through.
var targetCQRSFaults = Target{Name: "nudge beside CQRS: events applied twice or lost under the faults", Op: AtMost, Threshold: 0, Unit: "events"}

var systemLabels = map[string]string{systemCQRS: "Watermill CQRS", systemNudge: "nudge"}

func runCQRS(ctx context.Context, h *harness, sec *Section) error {
	cs := cqrsSizesFor(h.opts.quick)
	sec.Params["rate_per_s"], sec.Params["writers"], sec.Params["streams"] = cs.rate, cs.writers, cs.streams
	sec.Params["live_duration_s"], sec.Params["fault_events"] = cs.liveDuration.Seconds(), cs.faultEvents
	sec.Params["kills"], sec.Params["failed_publishes"], sec.Params["pg_poll_ms"] = cs.kills, cs.failedPublishes, Ms(h.opts.pgPoll)
	table := &Table{Header: []string{"system", "broker", "appends/s", "p50 ms", "p99 ms", "kills", "applied twice", "lost", "failed publishes", "lost", "rebuild"}}
	sec.table = table
	var nudgeBad float64
	for _, broker := range []string{chAMQP, chPostgres} {
		for _, system := range []string{systemCQRS, systemNudge} {
			row, err := h.cqrsRow(ctx, system, broker, cs)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", systemLabels[system], channelLabels[broker], err)
			}
			row.record(sec, table)
			if system == systemNudge {
				nudgeBad += float64(row.kill.duplicated + row.kill.lost + row.publish.lost)
			}
		}
	}
	sec.AddCheck(targetCQRSFaults, "nudge, both brokers", nudgeBad)
	sec.Note("live: append commit → read-model row committed, %d appends/s from %d writers, %s; CQRS saves the event, then publishes it; nudge on the PostgreSQL queue publishes the trigger in the append's transaction, on RabbitMQ through the relay",
		cs.rate, cs.writers, cs.liveDuration)
	sec.Note("kills: a consumer in a child process SIGKILLs itself right after a write committed and before the ack, %d times in a run of %d events; failed publishes: the publish after the commit fails (CQRS: the event's; nudge: the relay's trigger), counted from the store's events against the read model's rows",
		cs.kills, cs.faultEvents)
	return nil
}

// cqrsRow is one system on one broker.
type cqrsRow struct {
	system, broker string
	live           Latency
	appendsPerS    float64
	kill, publish  faultResult
}

func (h *harness) cqrsRow(ctx context.Context, system, broker string, cs cqrsSizes) (cqrsRow, error) {
	row := cqrsRow{system: system, broker: broker}
	var err error
	if system == systemCQRS {
		row.live, row.appendsPerS, err = h.runCQRSLive(ctx, broker, cs)
	} else {
		var res liveResult
		res, err = h.runLive(ctx, liveConfig{channel: broker, projections: 1, rate: cs.rate, writers: cs.writers, streams: cs.streams,
			duration: cs.liveDuration, newProjection: activityProjection})
		row.live, row.appendsPerS = res.latency, res.appendsPerS
	}
	if err != nil {
		return row, fmt.Errorf("live: %w", err)
	}
	if row.kill, err = h.runCQRSFault(ctx, system, broker, cs.kills, 0, cs); err != nil {
		return row, fmt.Errorf("kills: %w", err)
	}
	if row.publish, err = h.runCQRSFault(ctx, system, broker, 0, cs.failedPublishes, cs); err != nil {
		return row, fmt.Errorf("failed publishes: %w", err)
	}
	h.log.InfoContext(ctx, "cqrs comparison row done", slog.String("system", system), slog.String("broker", broker),
		slog.Float64("p99_ms", Ms(row.live.P99)), slog.Int64("applied_twice", row.kill.duplicated),
		slog.Int64("lost_kills", row.kill.lost), slog.Int64("lost_failed_publishes", row.publish.lost))
	return row, nil
}

func (r cqrsRow) record(sec *Section, table *Table) {
	label := systemLabels[r.system] + " " + channelLabels[r.broker]
	cqrsLabel := systemLabels[systemCQRS] + " " + channelLabels[r.broker]
	m := Metric{Case: label + " live", Name: "p99_ms", Unit: "ms", Value: Ms(r.live.P99), Extra: r.live.Extra()}
	m.Extra["appends_per_s"] = r.appendsPerS
	kill := Metric{Case: label + " killed between write and ack", Name: "applied_twice", Unit: "events", Value: float64(r.kill.duplicated),
		Extra: r.kill.extra()}
	pub := Metric{Case: label + " publish after commit failed", Name: "lost", Unit: "events", Value: float64(r.publish.lost), Extra: r.publish.extra()}
	rebuild := "not possible: acked messages are gone; republish the history"
	if r.system == systemNudge {
		rebuild = "nudge rebuild"
		sec.AddMetric(m.WithBaseline(cqrsLabel+" live", sec.metricValue(cqrsLabel+" live", "p99_ms")))
	} else {
		sec.AddMetric(m)
	}
	sec.AddMetric(kill)
	sec.AddMetric(pub)
	table.Add(systemLabels[r.system], channelLabels[r.broker], FormatValue(r.appendsPerS, ""), FormatValue(Ms(r.live.P50), "ms"), FormatValue(Ms(r.live.P99), "ms"),
		fmt.Sprint(r.kill.kills), fmt.Sprint(r.kill.duplicated), fmt.Sprint(r.kill.lost),
		fmt.Sprint(r.publish.failedPublishes), fmt.Sprint(r.publish.lost), rebuild)
}

// metricValue returns the value of the section's metric of that case and name, 0 if none.
func (s *Section) metricValue(c, name string) float64 {
	for _, m := range s.Metrics {
		if m.Case == c && m.Name == name {
			return m.Value
		}
	}
	return 0
}

// runCQRSLive measures the CQRS processor's live latency on broker: appends at cs.rate,
// each saved then published, while an in-process processor applies them.
func (h *harness) runCQRSLive(ctx context.Context, broker string, cs cqrsSizes) (Latency, float64, error) {
	f, err := h.newFixture(ctx, int32(cs.writers+8))
	if err != nil {
		return Latency{}, 0, err
	}
	defer f.close()
	spec, cleanup := h.cqrsSpec(f, systemCQRS, broker, "cqrs_live")
	defer cleanup()
	if _, err := f.db.pool.Exec(ctx, fmt.Sprintf(activityDDL, pgx.Identifier{spec.Table}.Sanitize())); err != nil {
		return Latency{}, 0, err
	}
	wlog := watermill.NewSlogLogger(h.libLog)
	b, err := openCQRSBroker(spec, f.db.pool, wlog)
	if err != nil {
		return Latency{}, 0, err
	}
	defer func() { _ = b.close() }()
	if err := b.declare(); err != nil {
		return Latency{}, 0, err
	}
	a := newCQRSApplier(f.db.pool, spec.Table)
	pctx, cancel := context.WithCancel(ctx)
	wait, err := runCQRSProcessor(pctx, b, wlog, a.apply)
	if err != nil {
		cancel()
		return Latency{}, 0, err
	}
	defer func() { cancel(); _ = wait() }()
	bus, err := b.eventBus()
	if err != nil {
		return Latency{}, 0, err
	}
	stp := newSaveThenPublish(f.store, bus, h.libLog)
	live := liveConfig{rate: cs.rate, writers: cs.writers, streams: cs.streams, duration: cs.liveDuration}
	ignore := func(uuid.UUID, time.Time) {}
	applied := func(n int) func() (bool, error) {
		return func() (bool, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.visible) >= n, nil
		}
	}
	warmed := 0
	if d := h.opts.liveWarmup; d > 0 { // as runLive does for nudge
		warm := live
		warm.duration = d
		var err error
		if warmed, err = appendPaced(ctx, &wiring{store: stp}, warm, ignore); err != nil {
			return Latency{}, 0, fmt.Errorf("warm-up: %w", err)
		}
		if err := waitUntil(ctx, time.Minute, 5*time.Millisecond, "the CQRS handler applied every warm-up event", applied(warmed)); err != nil {
			return Latency{}, 0, err
		}
		stp.forget() // no latency of the warm-up counts
	}
	appended, err := appendPaced(ctx, &wiring{store: stp}, live, ignore)
	if err != nil {
		return Latency{}, 0, err
	}
	if err := waitUntil(ctx, time.Minute, 5*time.Millisecond, "the CQRS handler applied every event", applied(warmed+appended)); err != nil {
		return Latency{}, 0, err
	}
	return stp.latencies(a), Rate(appended, cs.liveDuration), nil
}

// latencies returns commit → applied for every event s committed and a applied.
func (s *saveThenPublish) latencies(a *cqrsApplier) Latency {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	samples := make([]time.Duration, 0, len(s.committed))
	for id, at := range s.committed {
		if seen, ok := a.visible[id]; ok {
			samples = append(samples, max(seen.Sub(at), 0))
		}
	}
	return Summarize(samples)
}

// cqrsSpec returns the spec of a run's consumers on f's database and a fresh RabbitMQ
// prefix; cleanup deletes the RabbitMQ topology both systems declare there.
func (h *harness) cqrsSpec(f *fixture, system, broker, table string) (cqrsSpec, func()) {
	spec := cqrsSpec{System: system, Broker: broker, DatabaseURL: f.db.url, AMQPURL: h.opts.amqpURL, PGPoll: h.opts.pgPoll, Table: table}
	if broker != chAMQP {
		return spec, func() {}
	}
	env := h.newAMQP()
	spec.Prefix = env.prefix
	return spec, func() {
		var err error
		if system == systemNudge {
			err = env.cleanup([]string{table})
		} else {
			err = deleteCQRSTopology(env, spec.Prefix+"events")
		}
		if err != nil {
			h.log.Warn("could not delete the run's RabbitMQ queues", slog.String("prefix", env.prefix), slog.Any("error", err))
		}
	}
}

// deleteCQRSTopology deletes the CQRS event bus's exchange and the handler's queue.
func deleteCQRSTopology(env amqpEnv, topic string) error {
	conn, err := dialAMQP(env.url, env.prefix+"cleanup")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	_, qerr := ch.QueueDelete(topic+"_"+cqrsHandlerName, false, false, false)
	return errors.Join(qerr, ch.ExchangeDelete(topic, false, false))
}

// faultResult is what one fault run counted from the databases.
type faultResult struct {
	appended        int64
	kills           int64
	failedPublishes int64
	duplicated      int64 // events with more than one row: rows beyond the first
	lost            int64 // store events without a row
}

func (r faultResult) extra() map[string]float64 {
	return map[string]float64{"appended": float64(r.appended), "kills": float64(r.kills), "failed_publishes": float64(r.failedPublishes),
		"applied_twice": float64(r.duplicated), "lost": float64(r.lost)}
}

// runCQRSFault appends cs.faultEvents events at cs.rate while consumers of system run in
// child processes, kills of them SIGKILLed between a write and its ack and failures
// publishes after the commit failing, then waits until the consumer is done and counts.
func (h *harness) runCQRSFault(ctx context.Context, system, broker string, kills, failures int, cs cqrsSizes) (faultResult, error) {
	var res faultResult
	f, err := h.newFixture(ctx, int32(cs.writers+8))
	if err != nil {
		return res, err
	}
	defer f.close()
	spec, cleanup := h.cqrsSpec(f, system, broker, activityName)
	defer cleanup()
	if _, err := f.db.pool.Exec(ctx, fmt.Sprintf(activityDDL, pgx.Identifier{spec.Table}.Sanitize())); err != nil {
		return res, err
	}
	side, err := h.openFaultSide(ctx, f, spec, failures, cs)
	if err != nil {
		return res, err
	}
	defer side.close()
	exe, err := os.Executable()
	if err != nil {
		return res, err
	}
	cons := &consumers{spec: spec, exe: exe, planned: kills, killAt: max(1, cs.faultEvents/(2*(kills+1))), done: make(chan struct{})}
	cctx, stopConsumers := context.WithCancel(ctx)
	go cons.run(cctx)
	defer func() { stopConsumers(); <-cons.done }()

	last, err := appendN(ctx, side.store, cs)
	if err != nil {
		return res, err
	}
	if err := waitUntil(ctx, 2*time.Minute, 10*time.Millisecond, fmt.Sprintf("%d consumers were killed", kills), func() (bool, error) {
		return cons.killed.Load() >= int64(kills), cons.failure()
	}); err != nil {
		return res, err
	}
	if err := side.drain(ctx, last, cons.failure); err != nil {
		return res, err
	}
	stopConsumers()
	<-cons.done
	res, err = countFaults(ctx, f, spec.Table)
	res.kills, res.failedPublishes = cons.killed.Load(), int64(side.failed())
	return res, err
}

// countFaults counts the store's events, the rows beyond the first of each event and the
// events without a row.
func countFaults(ctx context.Context, f *fixture, table string) (faultResult, error) {
	var r faultResult
	t := pgx.Identifier{table}.Sanitize()
	err := f.db.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM nudge_events),
		(SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM `+t+` a JOIN nudge_events e USING (event_id) GROUP BY event_id) d),
		(SELECT count(*) FROM nudge_events e WHERE NOT EXISTS (SELECT 1 FROM `+t+` a WHERE a.event_id = e.event_id))`).
		Scan(&r.appended, &r.duplicated, &r.lost)
	if err != nil {
		return r, fmt.Errorf("count the read model against the store: %w", err)
	}
	return r, nil
}

// faultSide is the appending side of a fault run.
type faultSide struct {
	store  appender
	failed func() int
	// drain waits until the consumer has handled everything that reached the broker; last is
	// the position of the last event appended.
	drain func(ctx context.Context, last eventstore.Position, failure func() error) error
	close func()
}

// openFaultSide opens the appending side of spec's system: CQRS saves then publishes on the
// event bus, its publish failing failures times; nudge appends and runs a relay whose
// publish fails failures times.
func (h *harness) openFaultSide(ctx context.Context, f *fixture, spec cqrsSpec, failures int, cs cqrsSizes) (*faultSide, error) {
	if spec.System == systemNudge {
		return h.openNudgeFaultSide(ctx, f, spec, failures)
	}
	b, err := openCQRSBroker(spec, f.db.pool, watermill.NewSlogLogger(h.libLog))
	if err != nil {
		return nil, err
	}
	bus, err := b.eventBus()
	if err == nil {
		err = b.declare()
	}
	if err != nil {
		_ = b.close()
		return nil, err
	}
	stp := newSaveThenPublish(f.store, bus, h.libLog)
	inj := &injector{every: max(1, cs.faultEvents/(failures+1)), limit: failures}
	stp.failPublish = inj.hit
	// The marker is published last and never fails: once its row is there, every message
	// before it was handled (one consumer, in order; a redelivered message comes first).
	marker := &TicketWasUpdated{EventID: uuid.New(), StreamID: "marker", Version: 1}
	drain := func(ctx context.Context, _ eventstore.Position, failure func() error) error {
		if err := bus.Publish(ctx, marker); err != nil {
			return fmt.Errorf("publish the marker: %w", err)
		}
		return waitUntil(ctx, 2*time.Minute, 10*time.Millisecond, "the CQRS consumer handled every message", func() (bool, error) {
			var n int
			err := f.db.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{spec.Table}.Sanitize()+` WHERE event_id = $1`, marker.EventID).Scan(&n)
			return n > 0, errors.Join(err, failure())
		})
	}
	return &faultSide{store: stp, failed: inj.count, drain: drain, close: func() { _ = b.close() }}, nil
}

func (h *harness) openNudgeFaultSide(ctx context.Context, f *fixture, spec cqrsSpec, failures int) (*faultSide, error) {
	ch, err := openNudgeChannel(ctx, spec, f.db.pool, h.libLog)
	if err != nil {
		return nil, err
	}
	inj := &injector{every: relayFailEvery, limit: failures}
	rcfg, err := h.relayConfig(f)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	rel, err := relay.New(f.backend, &failingPublisher{ch: ch, fail: inj.hit}, rcfg)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = rel.Run(rctx) })
	// The projection's position passes the last appended event once that event is readable
	// (no transaction older than it runs in the cluster) and handled.
	drain := func(ctx context.Context, last eventstore.Position, failure func() error) error {
		return waitUntil(ctx, 2*time.Minute, 10*time.Millisecond, "the nudge projection caught up", func() (bool, error) {
			st, err := f.backend.StatusOf(ctx, spec.Table)
			return err == nil && !st.Position.Less(last), failure()
		})
	}
	return &faultSide{store: f.store, failed: inj.count, drain: drain, close: func() { cancel(); wg.Wait(); _ = ch.Close() }}, nil
}

// relayFailEvery: the relay's publishes fail one in this many, until the run's failures are
// in. Every one: the relay retries a failed publish (the same events, more if more came), so
// the failures happen whatever the load, in a row at the start of the run.
const relayFailEvery = 1

// failingPublisher is a channel whose publish fails when fail says so, after the events
// committed: the relay's FlushFunc gets the error.
type failingPublisher struct {
	ch   channel.Channel
	fail func() bool
}

func (p *failingPublisher) Publish(ctx context.Context, t trigger.Trigger) error {
	if p.fail() {
		return errors.New("injected: the broker refused the publish")
	}
	return p.ch.Publish(ctx, t)
}

// injector picks every nth call, at most limit of them.
type injector struct {
	every, limit int
	mu           sync.Mutex
	calls, hits  int
}

func (i *injector) hit() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.calls++
	if i.every > 0 && i.calls%i.every == 0 && i.hits < i.limit {
		i.hits++
		return true
	}
	return false
}

func (i *injector) count() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.hits
}

// consumers runs the consumers of a fault run one after another, each in a child process:
// the first planned ones SIGKILL themselves after killAt events, the last runs until ctx ends.
type consumers struct {
	spec    cqrsSpec
	exe     string
	planned int
	killAt  int
	killed  atomic.Int64
	done    chan struct{}

	mu  sync.Mutex
	err error
}

func (c *consumers) run(ctx context.Context) {
	defer close(c.done)
	for i := 0; ctx.Err() == nil; i++ {
		spec := c.spec
		if i < c.planned {
			spec.KillAt = c.killAt
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			c.fail(err)
			return
		}
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, c.exe)
		cmd.Env = append(os.Environ(), cqrsChildEnv+"="+string(raw))
		cmd.Stderr = &stderr
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 2 * cqrsCloseTimeout
		err = cmd.Run()
		if ctx.Err() != nil {
			return
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && spec.KillAt > 0 {
			c.killed.Add(1)
			continue
		}
		c.fail(fmt.Errorf("consumer %d exited (%w): %s", i, err, tail(stderr.String(), 2000)))
		return
	}
}

func (c *consumers) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

// failure returns why the consumers stopped, nil while they run.
func (c *consumers) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// appendN appends cs.faultEvents events from cs.writers writers over cs.streams streams, at
// most cs.rate a second in all: a count, not a duration, so that a loaded machine appends as
// many events (more slowly) and every planned kill finds events to kill on. It returns the
// position of the last event in the store's read order.
func appendN(ctx context.Context, store appender, cs cqrsSizes) (eventstore.Position, error) {
	interval := time.Second * time.Duration(cs.writers) / time.Duration(cs.rate)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		last eventstore.Position
	)
	errs := make(chan error, cs.writers)
	for wr := range cs.writers {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := wr; i < cs.faultEvents; i += cs.writers {
				select {
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				case <-tick.C:
				}
				data, err := eventstore.NewEventData("TicketWasUpdated", livePayload{Writer: wr, N: i})
				var res eventstore.AppendResult
				if err == nil {
					res, err = store.Append(ctx, fmt.Sprintf("ticket-%03d", i%cs.streams), eventstore.Any, data)
				}
				if err != nil {
					errs <- fmt.Errorf("append: %w", err)
					return
				}
				mu.Lock()
				if p := res.Events[0].Position; last.Less(p) {
					last = p
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	return last, <-errs // nil when no writer failed
}
