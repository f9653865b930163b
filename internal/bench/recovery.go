package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nudgeworks/nudge/deadletter"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

const (
	// recoveryEventsPerAppend is the size of the appends that arrive while the projection is stuck.
	recoveryEventsPerAppend = 10
	// recoveryStreams is how many tickets (streams) the arriving events are spread over.
	recoveryStreams = 1000
	// recoveryQuiet is how long the worker must receive no trigger before the fix: the
	// backlog of triggers that arrived while it was stuck has been worked off.
	recoveryQuiet = time.Second
)

// recoveryRetry retries a failing trigger briefly, so the triggers that arrive while the
// projection is stuck are dead-lettered quickly.
var recoveryRetry = retry.Policy{MaxAttempts: 2, InitialInterval: 20 * time.Millisecond, MaxInterval: 40 * time.Millisecond, MaxElapsedTime: time.Second}

// errPoison is the bug: the handler cannot handle the poison event until it is fixed.
var errPoison = errors.New("cannot handle this event (a bug, fixed later in the run)")

// recoveryTicket is the payload of the recovery's events; one is poison.
type recoveryTicket struct {
	ticketRegistered
	Poison bool `json:"poison,omitempty"`
}

// recoveryProjection is the ticket read model with a bug: it fails on the poison event until
// fixed is set.
func recoveryProjection(name string, fixed *atomic.Bool) (*projection.Projection, error) {
	upsert := ticketUpsertSQL(name)
	return projection.New(name, ticketConfig(name, 0),
		projection.OnQueued(rebuildEventType, func(_ context.Context, q *projection.Queue, e projection.Event[recoveryTicket]) error {
			if e.Data.Poison && !fixed.Load() {
				return errPoison
			}
			q.Queue(upsert, e.Data.TicketID, e.Data.Customer, e.Data.Price, e.StreamVersion)
			return nil
		}))
}

// caughtUpSignal closes done once a committed batch reaches the target position.
type caughtUpSignal struct {
	mu       sync.Mutex
	target   *eventstore.Position
	first    time.Time // the first committed batch
	done     chan struct{}
	isClosed bool
}

func (c *caughtUpSignal) onBatch(b projection.BatchReport) {
	if b.Err != nil || b.Events == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first.IsZero() {
		c.first = time.Now()
	}
	if c.target != nil && !b.Position.Less(*c.target) && !c.isClosed {
		close(c.done)
		c.isClosed = true
	}
}

func (c *caughtUpSignal) arm(target eventstore.Position) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.target, c.first = &target, time.Time{}
}

func runRecovery(ctx context.Context, h *harness, sec *Section) error {
	n := h.sizes.recoveryEvents
	sec.Params["events"], sec.Params["events_per_append"], sec.Params["writers"] = n, recoveryEventsPerAppend, appendWriters
	sec.Params["streams"], sec.Params["channel"] = recoveryStreams, chAMQP
	sec.Params["retry_attempts"], sec.Params["retry_initial_ms"] = recoveryRetry.MaxAttempts, Ms(recoveryRetry.InitialInterval)
	table := &Table{Header: []string{"case", "seconds", "events/s", "baseline s", "ratio"}}
	sec.table = table

	f, err := h.newFixture(ctx, appendWriters+8)
	if err != nil {
		return err
	}
	defer f.close()
	dead, err := dlpostgres.New(f.db.pool, dlpostgres.Config{})
	if err != nil {
		return err
	}
	if err := dead.Migrate(ctx); err != nil {
		return err
	}
	const name = "recovery"
	var fixed atomic.Bool
	p, err := recoveryProjection(name, &fixed)
	if err != nil {
		return err
	}
	signal := &caughtUpSignal{done: make(chan struct{})}
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog, OnBatch: signal.onBatch}, p)
	if err != nil {
		return err
	}
	if err := runner.Init(ctx); err != nil {
		return err
	}
	w, err := h.openChannel(ctx, f, chAMQP, []string{name})
	if err != nil {
		return err
	}
	defer w.close()
	wk, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{SafetyNetInterval: -1, DeadLetters: dead,
		DisableReplayOnStart: true, Retry: recoveryRetry})
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()

	// 1. The poison event: the projection fails on it and its trigger is dead-lettered.
	poison, err := eventstore.NewEventData(rebuildEventType, recoveryTicket{ticketRegistered: ticketRegistered{TicketID: "poison", Customer: "x", Price: 1}, Poison: true})
	if err != nil {
		return err
	}
	poisonRes, err := f.store.Append(ctx, "poison", eventstore.NoStream, poison)
	if err != nil {
		return err
	}
	failed := []deadletter.Status{deadletter.StatusFailed}
	if err := waitUntil(ctx, time.Minute, 20*time.Millisecond, "the poison event's trigger was dead-lettered", func() (bool, error) {
		recs, err := dead.List(ctx, deadletter.Filter{Projection: name, Status: failed})
		return len(recs) > 0, err
	}); err != nil {
		return err
	}

	// 2. Events arrive while the projection is stuck; their triggers fail and fold into the
	// dead letter.
	arrival := time.Now()
	last, err := appendArrivals(ctx, f, n)
	if err != nil {
		return err
	}
	arrivalTook := time.Since(arrival)
	h.log.InfoContext(ctx, "recovery: events arrived while the projection was stuck", slog.String("projection", name),
		slog.Int("events", n), slog.Duration("took", arrivalTook.Round(time.Millisecond)))
	if err := waitQuiet(ctx, wk, name); err != nil {
		return err
	}
	st, err := runner.Status(ctx, name)
	if err != nil {
		return err
	}
	if st.State != projection.StateFailing || st.FailingEvent == nil || st.FailingEvent.ID != poisonRes.Events[0].ID || st.Position != (eventstore.Position{}) {
		return fmt.Errorf("before the fix the projection should be failing on the poison event at the start; it is %s at %s", st.State, st.Position)
	}
	recs, err := dead.List(ctx, deadletter.Filter{Projection: name, Status: failed})
	if err != nil {
		return err
	}
	deliveries := 0
	for _, r := range recs {
		deliveries += r.Count
	}
	stats := wk.Stats(name)

	// 3. The fix, and one replay: time until the projection has caught up.
	signal.arm(last)
	fixed.Store(true)
	fixedAt := time.Now()
	replayed, err := deadletter.Replay(ctx, dead, w.ch, deadletter.ReplayFilter{Projection: name}, "bench", time.Now())
	if err != nil {
		return err
	}
	replayTook := time.Since(fixedAt)
	select {
	case <-signal.done:
	case <-time.After(10 * time.Minute):
		return errors.New("the projection did not catch up within 10 minutes of the replay")
	case <-ctx.Done():
		return ctx.Err()
	}
	recovered := time.Since(fixedAt)
	signal.mu.Lock()
	firstBatch := signal.first.Sub(fixedAt)
	signal.mu.Unlock()
	if err := stop(); err != nil {
		return err
	}
	if err := f.checkArrivals(ctx, name, n); err != nil {
		return err
	}

	// 4. Baseline: an identical, healthy projection catching up the same events directly.
	baseline, err := recoveryProjection(name+"_baseline", &fixed)
	if err != nil {
		return err
	}
	baseRunner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog}, baseline)
	if err != nil {
		return err
	}
	if err := baseRunner.Init(ctx); err != nil {
		return err
	}
	started := time.Now()
	res, err := baseRunner.CatchUp(ctx, baseline.Name())
	if err != nil {
		return err
	}
	baseTook := time.Since(started)
	if err := f.checkArrivals(ctx, baseline.Name(), n); err != nil {
		return err
	}

	const baseCase = "plain catch-up of the same events (healthy projection)"
	sec.AddMetric(Metric{Case: baseCase, Name: "seconds", Unit: "s", Value: baseTook.Seconds(),
		Extra: map[string]float64{"events": float64(res.Events), "events_per_s": Rate(res.Events, baseTook)}})
	c := "fix + one replay → caught up"
	m := Metric{Case: c, Name: "seconds", Unit: "s", Value: recovered.Seconds(), Extra: map[string]float64{
		"events": float64(n + 1), "events_per_s": Rate(n+1, recovered), "replay_call_ms": Ms(replayTook),
		"first_batch_ms": Ms(firstBatch), "arrival_s": arrivalTook.Seconds(), "dead_letter_records": float64(len(recs)),
		"dead_lettered_deliveries": float64(deliveries), "triggers_received_while_stuck": float64(stats.Received),
		"replayed_records": float64(replayed.Replayed)}}.WithBaseline(baseCase, baseTook.Seconds())
	sec.AddMetric(m)
	table.Add(baseCase, FormatValue(baseTook.Seconds(), "s"), FormatValue(Rate(res.Events, baseTook), ""), "", "")
	table.Add(c, FormatValue(recovered.Seconds(), "s"), FormatValue(Rate(n+1, recovered), ""), FormatValue(baseTook.Seconds(), "s"), FormatValue(m.Ratio, "×"))
	sec.Note("stuck on the first event while %s events arrived in %.1f s (8 writers, %d a transaction): %d trigger(s) received, %d dead-lettered deliveries folded into %d record(s)",
		Thousands(int64(n)), arrivalTook.Seconds(), recoveryEventsPerAppend, stats.Received, deliveries, len(recs))
	sec.Note("after the fix: Replay returned in %.1f ms, the first batch committed %.1f ms after the fix; RabbitMQ, per-event handlers (OnQueued)", Ms(replayTook), Ms(firstBatch))
	return nil
}

// appendArrivals appends n events from appendWriters writers, recoveryEventsPerAppend a
// transaction, append k going to ticket k % recoveryStreams, and returns the last position.
func appendArrivals(ctx context.Context, f *fixture, n int) (eventstore.Position, error) {
	appends := n / recoveryEventsPerAppend
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		last  eventstore.Position
		first error
		next  atomic.Int64
	)
	for range appendWriters {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= appends || ctx.Err() != nil {
					return
				}
				ticket := fmt.Sprintf("ticket-%04d", k%recoveryStreams)
				events := make([]eventstore.EventData, recoveryEventsPerAppend)
				for i := range events {
					events[i] = eventstore.EventData{Type: rebuildEventType, Payload: []byte(ticketPayload(ticket, k*recoveryEventsPerAppend+i))}
				}
				res, err := f.store.Append(ctx, ticket, eventstore.Any, events...)
				mu.Lock()
				if err != nil {
					first = cmpOrErr(first, err)
				} else if last.Less(res.Last()) {
					last = res.Last()
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return last, fmt.Errorf("append: %w", first)
	}
	return last, ctx.Err()
}

// checkArrivals checks the read model of the poison event and n arrived events.
func (f *fixture) checkArrivals(ctx context.Context, table string, n int) error {
	rows, sum, err := f.count(ctx, table)
	if err != nil {
		return err
	}
	appends := n / recoveryEventsPerAppend
	wantRows := int64(min(appends, recoveryStreams)) + 1  // the tickets and the poison one
	wantSum := int64(appends*recoveryEventsPerAppend) + 1 // each ticket's last version is its event count
	if rows != wantRows || sum != wantSum {
		return fmt.Errorf("read model %s is wrong: %d rows with versions summing to %d, want %d and %d", table, rows, sum, wantRows, wantSum)
	}
	return nil
}

// waitQuiet waits until the worker has received no trigger for the projection for
// recoveryQuiet: the triggers of the arrivals have all been tried and dead-lettered.
func waitQuiet(ctx context.Context, wk *worker.Worker, name string) error {
	last, since := wk.Stats(name).Received, time.Now()
	return waitUntil(ctx, 5*time.Minute, 50*time.Millisecond, "the stuck projection's triggers were worked off", func() (bool, error) {
		if r := wk.Stats(name).Received; r != last {
			last, since = r, time.Now()
		}
		return time.Since(since) >= recoveryQuiet, nil
	})
}
