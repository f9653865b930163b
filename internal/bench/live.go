package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/gochannel"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

// The channels measured, in the order they are shown.
const (
	chAMQP      = "amqp"
	chPostgres  = "postgres"
	chGoChannel = "gochannel"
)

var channelKinds = []string{chAMQP, chPostgres, chGoChannel}

var channelLabels = map[string]string{chAMQP: "RabbitMQ", chPostgres: "PostgreSQL queue", chGoChannel: "GoChannel"}

// wiring is a trigger channel and the way appends publish to it.
type wiring struct {
	kind string
	ch   channel.Channel
	// appender publishes in the append's transaction (PostgreSQL queue); nil: a relay.Relay
	// publishes (RabbitMQ, GoChannel).
	appender *relay.Appender
	// ownRelay: the run publishes through one relay of its own; workers start none.
	ownRelay bool
	store    interface {
		Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error)
	}
	cleanup func()
}

// openChannel opens a channel of kind on f's database (PostgreSQL queue) or on a fresh
// RabbitMQ prefix, declares the projections and returns how appends publish to it. close
// closes it and deletes its RabbitMQ topology.
func (h *harness) openChannel(ctx context.Context, f *fixture, kind string, projections []string) (*wiring, error) {
	w := &wiring{kind: kind, store: f.store, cleanup: func() {}}
	switch kind {
	case chAMQP:
		env := h.newAMQP()
		ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.url, Prefix: env.prefix, ConnectionName: env.connectionName, Logger: h.libLog})
		if err != nil {
			return nil, err
		}
		w.ch = ch
		w.cleanup = func() {
			if err := env.cleanup(projections); err != nil {
				h.log.Warn("could not delete the run's RabbitMQ queues", slog.String("prefix", env.prefix), slog.Any("error", err))
			}
		}
	case chPostgres:
		size := int32(len(projections) + 4)
		if f.channelPool > 0 {
			size = f.channelPool
		}
		pool, err := f.db.newPool(ctx, size)
		if err != nil {
			return nil, err
		}
		ch, err := pgchannel.New(pool, pgchannel.Config{PollInterval: h.opts.pgPoll, DisableListen: h.opts.noListen, Logger: h.libLog})
		if err != nil {
			return nil, err
		}
		w.ch = ch
		if w.appender, err = relay.NewAppender(f.store, ch); err != nil {
			_ = ch.Close()
			return nil, err
		}
		w.store = w.appender
	case chGoChannel:
		ch, err := gochannel.New(gochannel.Config{})
		if err != nil {
			return nil, err
		}
		w.ch = ch
	default:
		return nil, fmt.Errorf("unknown channel %q", kind)
	}
	if err := w.ch.Declare(ctx, projections...); err != nil {
		w.close()
		return nil, fmt.Errorf("declare the projections on %s: %w", kind, err)
	}
	return w, nil
}

// relayConfig configures the relays of the run (-relay-interval) on f's database: woken by
// appends through f's listener, unless -no-listen.
func (h *harness) relayConfig(f *fixture) (relay.Config, error) {
	cfg := relay.Config{MinInterval: h.opts.relayInterval, Logger: h.libLog}
	if h.opts.noListen {
		return cfg, nil
	}
	l, err := f.waker(h.libLog)
	if err != nil {
		return cfg, err
	}
	cfg.Waker = l
	return cfg, nil
}

// undeclare deletes the projections' subscriptions on channels that keep them
// (channel.Undeclarer).
func (w *wiring) undeclare(ctx context.Context, projections ...string) error {
	u, ok := w.ch.(channel.Undeclarer)
	if !ok || len(projections) == 0 {
		return nil
	}
	return u.Undeclare(ctx, projections...)
}

func (w *wiring) close() {
	_ = w.ch.Close()
	w.cleanup()
}

// startWorker runs a worker of runner on w's channel (and a relay, unless appends publish in
// their transaction) until stop is called. It returns once the worker's handlers subscribed.
func (h *harness) startWorker(ctx context.Context, f *fixture, w *wiring, runner *projection.Runner, cfg worker.Config) (*worker.Worker, func() error, error) {
	cfg.Runner, cfg.Channel, cfg.Logger = runner, w.ch, h.libLog
	if cfg.DeadLetters == nil {
		cfg.DeadLetters = dlmemory.New(dlmemory.Config{}) // the bench's projections do not fail
	}
	if w.appender != nil {
		cfg.Store = f.store
	}
	wk, err := worker.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- wk.Run(ctx) })
	if w.appender == nil && !w.ownRelay {
		rcfg, err := h.relayConfig(f)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, nil, err
		}
		rel, err := relay.New(f.backend, w.ch, rcfg)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, nil, err
		}
		wg.Go(func() { errs <- rel.Run(ctx) })
	}
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				stopErr = errors.Join(stopErr, err)
			}
		})
		return stopErr
	}
	select {
	case <-wk.Running():
		return wk, stop, nil
	case <-time.After(setupTimeout):
		return nil, nil, errors.Join(fmt.Errorf("the worker did not start within %s", setupTimeout), stop())
	case <-ctx.Done():
		return nil, nil, errors.Join(ctx.Err(), stop())
	}
}

// liveRecorder records, per event, when its append returned and when each projection's batch
// that handled it committed (the read model is visible from then on).
type liveRecorder struct {
	measured []string
	// alias, if set, maps the projection of a batch report to the measured name it counts
	// for (the units of a projection's versions to the projection).
	alias func(projection string) string

	mu        sync.Mutex
	committed map[uuid.UUID]time.Time
	// warm are the events appended to warm up, awaited like the others but not measured.
	warm    map[uuid.UUID]struct{}
	pending map[string][]uuid.UUID // projection → the events of its batch in flight
	visible map[string]map[uuid.UUID]time.Time
}

func newLiveRecorder(measured []string) *liveRecorder {
	r := &liveRecorder{measured: measured, committed: map[uuid.UUID]time.Time{}, warm: map[uuid.UUID]struct{}{},
		pending: map[string][]uuid.UUID{}, visible: map[string]map[uuid.UUID]time.Time{}}
	for _, name := range measured {
		r.visible[name] = map[uuid.UUID]time.Time{}
	}
	return r
}

// appended records that e's append returned at.
func (r *liveRecorder) appended(id uuid.UUID, at time.Time) {
	r.mu.Lock()
	r.committed[id] = at
	r.mu.Unlock()
}

// warmedUp records that the warm-up event id was appended: complete awaits it, no sample
// counts it.
func (r *liveRecorder) warmedUp(id uuid.UUID, _ time.Time) {
	r.mu.Lock()
	r.warm[id] = struct{}{}
	r.mu.Unlock()
}

// flush notes events of a batch about to commit (from its handlers or its flush hook); the
// notes of a unit of work that commits several batches at once (a cut-over) add up until its
// report.
func (r *liveRecorder) flush(name string, events []eventstore.Event) {
	r.mu.Lock()
	for _, e := range events {
		r.pending[name] = append(r.pending[name], e.ID)
	}
	r.mu.Unlock()
}

// onBatch stamps the events of a committed batch (projection.RunnerConfig.OnBatch).
func (r *liveRecorder) onBatch(b projection.BatchReport) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := r.pending[b.Projection]
	delete(r.pending, b.Projection)
	name := b.Projection
	if r.alias != nil {
		name = r.alias(name)
	}
	seen, ok := r.visible[name]
	if b.Err != nil || !ok {
		return
	}
	for _, id := range ids {
		if _, dup := seen[id]; !dup {
			seen[id] = now
		}
	}
}

// complete reports whether every measured projection has made every appended event visible,
// those of the warm-up included.
func (r *liveRecorder) complete() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range r.measured {
		if len(r.visible[name]) < len(r.committed)+len(r.warm) {
			return false
		}
		for id := range r.committed { // visible may hold events appended before the run
			if _, ok := r.visible[name][id]; !ok {
				return false
			}
		}
		for id := range r.warm {
			if _, ok := r.visible[name][id]; !ok {
				return false
			}
		}
	}
	return true
}

// progress describes how far each measured projection got, for an error message.
func (r *liveRecorder) progress() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("%d appended;", len(r.committed))
	for _, name := range r.measured {
		s += fmt.Sprintf(" %s %d", name, len(r.visible[name]))
	}
	return s
}

// slowest returns the event with the longest latency in any measured projection: when its
// append returned, and its latency.
func (r *liveRecorder) slowest() (time.Time, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var (
		at  time.Time
		lat time.Duration
	)
	for _, name := range r.measured {
		for id, appended := range r.committed {
			if seen, ok := r.visible[name][id]; ok && seen.Sub(appended) > lat {
				at, lat = appended, seen.Sub(appended)
			}
		}
	}
	return at, lat
}

// samples returns, for every measured projection and every appended event, the time from the
// append's return to the commit of the batch that handled it (0 when the batch committed first).
func (r *liveRecorder) samples() []time.Duration { return r.samplesOf(r.measured) }

// samplesOf is samples for the projections called names.
func (r *liveRecorder) samplesOf(names []string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]time.Duration, 0, len(r.committed)*len(names))
	for _, name := range names {
		for id, at := range r.committed {
			if seen, ok := r.visible[name][id]; ok {
				out = append(out, max(seen.Sub(at), 0))
			}
		}
	}
	return out
}

// liveSample is one event's latency in one measured projection, with when its append returned.
type liveSample struct {
	appended time.Time
	latency  time.Duration
}

// timedSamples is samples with when each event's append returned.
func (r *liveRecorder) timedSamples() []liveSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]liveSample, 0, len(r.committed)*len(r.measured))
	for _, name := range r.measured {
		for id, at := range r.committed {
			if seen, ok := r.visible[name][id]; ok {
				out = append(out, liveSample{appended: at, latency: max(seen.Sub(at), 0)})
			}
		}
	}
	return out
}

// liveConfig is one live-latency run.
type liveConfig struct {
	channel     string
	projections int
	// slow adds a projection whose batches write, then sleep slowBatch in their transaction
	// (holding back the store's readers meanwhile); it is not measured.
	slow bool
	// onFailure is the measured projections' OnFailure; with poison, every other projection
	// (live_01, live_03, …) fails on the first event of poisonStream (its flush names it),
	// which parks that stream with OnFailurePark, and the others do not: both halves run side
	// by side under the same load. The poisoned stream's events are not measured.
	onFailure projection.OnFailure
	poison    bool
	rate      int
	writers   int
	streams   int
	duration  time.Duration
	// until, if set, ends the appends before duration when it returns true.
	until func() bool
	// relayQueue feeds the PostgreSQL queue through a relay, as the other channels are fed;
	// else its triggers are written in the appends' transactions (relay.Appender).
	relayQueue bool
	// newProjection makes the measured projections; defaults to liveProjection.
	newProjection func(name string, onFailure projection.OnFailure, hooks liveHooks) (*projection.Projection, error)
	// stalledDeadLetters runs the odd-numbered projections (the even-numbered with stallEven)
	// on a worker whose dead-letter store stalls for the measured window, the others on one
	// whose store answers (startLiveWorkers); their samples are the result's parked and clean
	// halves.
	stalledDeadLetters, stallEven bool
	// workers > 1 spreads the projections over that many workers in this process (round
	// robin, one relay for all), sharing the run's pools.
	workers int
	// poolSize, if set, bounds the store's pool (default: a connection per writer and
	// projection, and 6) and the PostgreSQL queue's.
	poolSize int32
	// window, if set, is called when the measured appends start, with the run's fixture; the
	// function it returns is called once every measured event is visible.
	window func(f *fixture) (end func() error, err error)
}

// slowBatch is how long the slow projection's batches take.
const slowBatch = 50 * time.Millisecond

// liveResult is what a live run measured.
type liveResult struct {
	latency Latency
	// clean and parked are, in a poisoned run, the samples of each projection with no parked
	// stream and of each with one.
	clean, parked [][]time.Duration
	appended      int
	appendsPerS   float64
	slowBatches   int64
	// staleness is package metrics' staleness histogram of the measured projections over the
	// measured window, read as histogram_quantile reads it.
	staleness stalenessSummary
	// batches and catchUps are the runner's committed batches and catch-ups (one per trigger
	// handled) from the start of the measured appends until every event was visible, which
	// took measured.
	batches, catchUps int64
	measured          time.Duration
}

// livePayload is the live events' payload.
type livePayload struct {
	Writer int `json:"w"`
	N      int `json:"n"`
}

// liveHooks are what a live run hangs on its projections: observe sees each event as its
// handler runs (the recorder, and a parking run's poison: an error fails the event), flush is
// the projection's flush hook (nil: none, so its handlers' statements go in the round trip
// that commits the batch, as in a projection that needs no hook).
type liveHooks struct {
	observe func(name string, e eventstore.Event) error
	flush   func(ctx context.Context, p projection.FlushParams) error
}

// see runs observe, if any, on e.
func (hk liveHooks) see(name string, e eventstore.Event) error {
	if hk.observe == nil {
		return nil
	}
	return hk.observe(name, e)
}

// liveProjection writes the latest version of each stream into a table of its own: a
// per-event handler that queues one upsert per event, sent in one round trip per batch
// (OnQueued), the batch's commit making them visible.
func liveProjection(name string, onFailure projection.OnFailure, hooks liveHooks) (*projection.Projection, error) {
	table := pgx.Identifier{name}.Sanitize()
	upsert := `INSERT INTO ` + table + ` (stream, version, n) VALUES ($1, $2, $3)
		ON CONFLICT (stream) DO UPDATE SET version = EXCLUDED.version, n = EXCLUDED.n WHERE ` + table + `.version < EXCLUDED.version`
	return projection.New(name, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (stream text PRIMARY KEY, version bigint NOT NULL, n bigint NOT NULL)`)
			return err
		},
		FlushFunc: hooks.flush,
		OnFailure: onFailure,
	}, projection.OnQueued("TicketWasUpdated", func(_ context.Context, q *projection.Queue, e projection.Event[livePayload]) error {
		if err := hooks.see(name, e.Event); err != nil {
			return err
		}
		q.Queue(upsert, e.StreamID, e.StreamVersion, e.Data.N)
		return nil
	}))
}

// runLive appends at cfg.rate from cfg.writers writers for cfg.duration while a worker runs
// the projections, and measures append commit → read model visible for every event and
// projection (the slow one excepted).
func (h *harness) runLive(ctx context.Context, cfg liveConfig) (liveResult, error) {
	var res liveResult
	poolSize := int32(cfg.writers + cfg.projections + 6)
	if cfg.poolSize > 0 {
		poolSize = cfg.poolSize
	}
	f, err := h.newFixture(ctx, poolSize)
	if err != nil {
		return res, err
	}
	defer f.close()
	f.channelPool = cfg.poolSize

	var names []string
	for i := range cfg.projections {
		names = append(names, fmt.Sprintf("live_%02d", i))
	}
	rec := newLiveRecorder(slices.Clone(names)) // the slow one, appended below, is not measured
	newProjection := cfg.newProjection
	if newProjection == nil {
		newProjection = liveProjection
	}
	var ps []*projection.Projection
	for _, name := range names {
		p, err := newProjection(name, cfg.onFailure, liveHooks{observe: func(name string, e eventstore.Event) error {
			if err := cfg.poisoned(name, e); err != nil {
				return err
			}
			rec.flush(name, []eventstore.Event{e})
			return nil
		}})
		if err != nil {
			return res, err
		}
		ps = append(ps, p)
	}
	var slowBatches atomic.Int64
	if cfg.slow {
		p, err := liveProjection("live_slow", cfg.onFailure, liveHooks{flush: func(ctx context.Context, _ projection.FlushParams) error {
			slowBatches.Add(1)
			return backoff.Sleep(ctx, slowBatch) // after the handlers wrote: the transaction holds an xid
		}})
		if err != nil {
			return res, err
		}
		ps = append(ps, p)
		names = append(names, p.Name())
	}
	probe, err := newStalenessProbe()
	if err != nil {
		return res, err
	}
	var batches, catchUps atomic.Int64
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog,
		OnBatch:   func(b projection.BatchReport) { batches.Add(1); rec.onBatch(b); probe.observe(b) },
		OnCatchUp: func(string, projection.Result, error) { catchUps.Add(1) }}, ps...)
	if err != nil {
		return res, err
	}
	if err := runner.Init(ctx); err != nil {
		return res, err
	}
	w, err := h.openChannel(ctx, f, cfg.channel, names)
	if err != nil {
		return res, err
	}
	defer w.close()
	if cfg.relayQueue {
		w.appender, w.store = nil, f.store // startWorker starts a relay
	}
	if cfg.poolSize > 0 {
		if err := separateAppends(ctx, f, w, cfg.writers); err != nil {
			return res, err
		}
	}
	workers, err := h.startLiveWorkers(ctx, f, w, runner, cfg, names)
	if err != nil {
		return res, err
	}
	stop := workers.stop
	defer func() { _ = stop() }()

	if cfg.poison {
		if err := warmPoisonStream(ctx, w, runner); err != nil {
			return res, err
		}
	}
	if err := warmUp(ctx, w, cfg, rec, h.opts.liveWarmup); err != nil {
		return res, err
	}
	if err := probe.mark(); err != nil {
		return res, err
	}
	if workers.stalled != nil {
		workers.stalled.Stall()
	}
	endWindow := func() error { return nil }
	if cfg.window != nil {
		if endWindow, err = cfg.window(f); err != nil {
			return res, err
		}
	}
	batches0, catchUps0, started := batches.Load(), catchUps.Load(), time.Now()
	appended, err := appendPaced(ctx, w, cfg, rec.appended)
	if err != nil {
		return res, err
	}
	res.appended = appended
	res.appendsPerS = Rate(appended, cfg.duration)
	if err := waitUntil(ctx, time.Minute, 5*time.Millisecond, "every projection made every event visible",
		func() (bool, error) { return rec.complete(), nil }); err != nil {
		return res, fmt.Errorf("%w (%s)", err, rec.progress())
	}
	res.measured, res.batches, res.catchUps = time.Since(started), batches.Load()-batches0, catchUps.Load()-catchUps0
	if err := endWindow(); err != nil {
		return res, err
	}
	if workers.stalled != nil {
		workers.stalled.Resume()
	}
	res.slowBatches = slowBatches.Load()
	if err := checkParked(ctx, runner, cfg); err != nil {
		return res, err
	}
	if err := stop(); err != nil {
		return res, fmt.Errorf("stop the worker: %w", err)
	}
	res.latency = Summarize(rec.samples())
	if res.staleness, err = probe.summary(rec.measured); err != nil {
		return res, err
	}
	if cfg.poison || cfg.stalledDeadLetters {
		for _, name := range rec.measured {
			if cfg.affected(name) {
				res.parked = append(res.parked, rec.samplesOf([]string{name}))
			} else {
				res.clean = append(res.clean, rec.samplesOf([]string{name}))
			}
		}
	}
	return res, nil
}

// separateAppends gives the run's writers a pool of their own, as an application's API
// process has: the workers' bounded pool then does not slow the appends down.
func separateAppends(ctx context.Context, f *fixture, w *wiring, writers int) error {
	pool, err := f.db.newNamedPool(ctx, int32(writers), writersApplication)
	if err != nil {
		return err
	}
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		return err
	}
	if w.appender == nil {
		w.store = store
		return nil
	}
	pub, ok := w.ch.(relay.TxPublisher)
	if !ok {
		return fmt.Errorf("the %s channel publishes in no transaction", w.kind)
	}
	if w.appender, err = relay.NewAppender(store, pub); err != nil {
		return err
	}
	w.store = w.appender
	return nil
}

// liveWarmupDefault is -live-warmup's default: long enough for every connection of the pools
// to be open and every statement prepared, a few hundred batches in; liveWarmupQuick is -quick's.
const (
	liveWarmupDefault = time.Second
	liveWarmupQuick   = 250 * time.Millisecond
)

// warmUp appends as a live run does for d, unmeasured, and waits until every measured
// projection has made those events visible: the measured window starts with the pools'
// connections open, the statements prepared and the broker's consumers running, as in a
// worker that has been up a while.
func warmUp(ctx context.Context, w *wiring, cfg liveConfig, rec *liveRecorder, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	warm := cfg
	warm.duration = d
	if _, err := appendPaced(ctx, w, warm, rec.warmedUp); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := waitUntil(ctx, time.Minute, 5*time.Millisecond, "every projection made every warm-up event visible",
		func() (bool, error) { return rec.complete(), nil }); err != nil {
		return fmt.Errorf("warm-up: %w (%s)", err, rec.progress())
	}
	return nil
}

// appendPaced appends one event per tick from cfg.writers writers, cfg.rate events a second
// in all, over cfg.streams streams, for cfg.duration, calling record with each event's ID and
// its append's return. It returns how many events were appended.
func appendPaced(ctx context.Context, w *wiring, cfg liveConfig, record func(uuid.UUID, time.Time)) (int, error) {
	interval := time.Second * time.Duration(cfg.writers) / time.Duration(cfg.rate)
	deadline := time.Now().Add(cfg.duration)
	var (
		wg    sync.WaitGroup
		total atomic.Int64
		mu    sync.Mutex
		first error
	)
	for wr := range cfg.writers {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; time.Now().Before(deadline) && (cfg.until == nil || !cfg.until()); i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				data, err := eventstore.NewEventData("TicketWasUpdated", livePayload{Writer: wr, N: i})
				if err == nil {
					var res eventstore.AppendResult
					stream := fmt.Sprintf("ticket-%03d", (wr+i*cfg.writers)%cfg.streams)
					res, err = appendTraced(ctx, w.store, stream, data)
					if err == nil {
						if !cfg.poison || stream != poisonStream {
							record(res.Events[0].ID, time.Now())
						}
						total.Add(1)
						continue
					}
				}
				mu.Lock()
				first = cmpOrErr(first, err)
				mu.Unlock()
				return
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("append: %w", first)
	}
	return int(total.Load()), ctx.Err()
}

func cmpOrErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
