// Package worker runs projections from triggers: one Watermill handler per projection, each with
// its own subscription, retries and dead letters, so a projection that fails forever never slows
// another. Add the handlers to a router you own (Prepare, AddHandlers, RunBackground: the same
// start-up duties as Run), or let Run do everything with a router of its own.
//
// A handler never projects the message it got: a trigger only makes its projection catch up from
// its own committed position. A trigger the projection has already passed (by position, or by
// event types it does not handle) costs no read at all. Triggers that cannot be decoded are
// dead-lettered at once; a projection whose handler keeps failing on an event is retried with
// backoff and then dead-lettered; infrastructure errors (database down) and shutdowns are nacked
// and come back.
//
// At start each projection catches up once without waiting for a trigger, and a safety-net tick
// periodically catches up every projection that has events waiting, so a lost trigger costs
// latency, never data.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
)

// Defaults for Config.
const (
	// SafetyNetIntervalDefault is how often the safety net looks for projections to catch up
	// without a trigger.
	SafetyNetIntervalDefault = 30 * time.Second
	// StallAfterDefault is how long readable events may wait, with the projection's position not
	// moving, before the safety net counts the projection as stalled.
	StallAfterDefault = 5 * time.Second
	// CloseTimeoutDefault bounds how long Run waits for handlers in flight at shutdown.
	CloseTimeoutDefault = 30 * time.Second
	// HorizonWaitDefault bounds a handler's wait for a trigger's position to become readable.
	HorizonWaitDefault = 2 * time.Second
	// DeadLetterTimeoutDefault bounds one dead-letter write.
	DeadLetterTimeoutDefault = 10 * time.Second
	// ReplayOnStartTimeout bounds a starting worker's replay of one projection's dead letters.
	// Records it does not reach wait for the next start.
	ReplayOnStartTimeout = time.Minute
)

// Config configures a Worker.
type Config struct {
	// Runner runs the projections. Required.
	Runner *projection.Runner
	// Channel carries the triggers. Required.
	Channel channel.Channel
	// Projections are the names to run. Defaults to all of the runner's.
	Projections []string
	// TriggerFunc, if set, is called with every append trigger a projection's handler
	// decodes (redundant ones included), as it arrives: metrics.Metrics.ObserveTrigger
	// measures the triggers' transit with it. It must be fast and safe for concurrent use.
	TriggerFunc func(TriggerReport)
	// Logger defaults to slog.Default(). Every line about a projection carries its name, and
	// every line logged within a span its trace_id and span_id.
	Logger *slog.Logger
	// TracerProvider receives a span per trigger handled, a child of the span that published
	// the trigger (its trace context travels in the message's metadata), and per replay of
	// dead letters at start. Batches and redrives are the Runner's (RunnerConfig.TracerProvider).
	// Defaults to otel.GetTracerProvider() (a no-op unless the application sets one).
	TracerProvider trace.TracerProvider
	// SafetyNetInterval is how often the safety net ticks (jittered ±10%): it reads every
	// projection's status at once and catches up, without a trigger, those with something to
	// do — events to read, a failure to retry, a rebuild, a version being built or retired —
	// and every projection at every tenth tick in any case. A lost trigger costs at most about
	// this much latency. Defaults to SafetyNetIntervalDefault; a negative value turns the tick
	// off (start-up catch-up stays).
	SafetyNetInterval time.Duration
	// StallAfter: at each safety-net tick, a projection that has readable events at least this
	// old while its position has not moved since the last tick is stalled — its triggers were
	// lost, or its catch-up is stuck. The worker logs a warning (once per stall), counts it
	// (Stats.Stalls, the metric worker_stalls_total) and catches up. Defaults to
	// StallAfterDefault; detection takes up to SafetyNetInterval more.
	StallAfter time.Duration
	// Retry is the backoff for a failing trigger before it is dead-lettered; zero fields take
	// retry's defaults (5 attempts over about 3 s, at most 20 s). Keep MaxElapsedTime below the
	// channel's ack deadline.
	Retry retry.Policy
	// DeadLetters keeps triggers whose retries are over (or that cannot be decoded): a trigger
	// is acked only once its dead letter is committed there, else nacked so it comes back.
	// Repeated failures on one event fold into one record. Required: deadletter/postgres is
	// the one `nudge deadletter` sees (deadletter/memory for tests and demos).
	DeadLetters deadletter.Store
	// DeadLetterTimeout bounds one dead-letter write (connection included). A write that does
	// not commit in time — the dead-letter database is partitioned away, say — fails with an
	// error matching ErrDeadLetterTimeout: the trigger is nacked and comes back, never acked
	// without its dead letter, and the subscription is free again. Keep the retry budget plus
	// this below the channel's ack deadline. It bounds each resolve of healed dead letters too,
	// which runs beside the triggers' handling, never in it. Defaults to
	// DeadLetterTimeoutDefault.
	DeadLetterTimeout time.Duration
	// TransientCauseFunc names the transient cause of a handler's error ("" when it is not
	// transient): a dead letter of such a failure is marked (deadletter.MetadataTransient) and
	// resolved as healed once the projection passes its event by itself. Defaults to
	// TransientCause: PostgreSQL's serialization failures, deadlocks, lock and statement
	// timeouts, lost connections, shutdowns and exhausted resources.
	TransientCauseFunc func(err error) string
	// DisableReplayOnStart turns off "replay after deploy": by default, once its handlers run,
	// the worker replays its projections' dead letters (status failed) and redrives their
	// parked streams (projection.Runner.RedriveAll), so a fix that was just deployed takes
	// effect without an operator. A projection whose bug is not fixed fails again and folds
	// into the same record; a parked stream whose redrive fails stays parked with the new error.
	// The replay takes the dead letters that last failed before New made the worker
	// (deadletter.ReplayFilter.FailedBefore): those its own first triggers wrote meanwhile are
	// this deployment's failures, not a fix's to retry.
	DisableReplayOnStart bool
	// CloseTimeout bounds Run's wait for handlers in flight at shutdown. Defaults to
	// CloseTimeoutDefault.
	CloseTimeout time.Duration
	// RouterFunc, if set, is called by Run with its router after the handlers are added and
	// before the router runs: add router-level middleware or plugins there, or Watermill's
	// metrics (RouterFunc: m.AddRouterMetrics, with package metrics). Users of AddHandlers own
	// their router.
	RouterFunc func(*message.Router) error
	// Store, if set, lets a handler wait (up to HorizonWait) until the event store can read up
	// to the trigger's position before it catches up. Set it when triggers are published in the
	// append's transaction (relay.Appender with the PostgreSQL-queue channel): such a trigger
	// can arrive while an older transaction still holds the store's readers back. Triggers from
	// a relay.Relay never need it.
	Store interface {
		Head(ctx context.Context) (eventstore.Position, error)
	}
	// HorizonWait bounds that wait. Defaults to HorizonWaitDefault. If the position is still not
	// readable, the handler catches up what it can and returns an error, so the trigger is
	// retried and then nacked, never acked with work left behind.
	HorizonWait time.Duration
	// Horizon, if set, names the open transaction that holds the store's readers back: Run
	// looks it up every HorizonPollInterval and logs a warning naming it (pid, database, user,
	// application, age, what it waits on) once it has held them for HorizonWarnAfter. Set it
	// to the *eventstore/postgres.Store.
	Horizon HolderSource
	// HorizonPollInterval defaults to HorizonPollIntervalDefault; a negative value turns the
	// look-up off.
	HorizonPollInterval time.Duration
	// HorizonWarnAfter defaults to HorizonWarnAfterDefault.
	HorizonWarnAfter time.Duration
	// Leases spreads the partitions of partitioned projections (projection.Config.Partitions)
	// over the workers that run them (see Leases). nil: this worker runs every partition of
	// them itself — right for one worker; with several, each partition's batch lock still
	// keeps its read model exactly-once, but nothing spreads the work.
	Leases *Leases
	// MaxConcurrentPartitions bounds the batches of partitions this worker runs at once (each
	// holds a database connection while it runs): a partition's batch waits for a slot, and a
	// slot is taken and freed per batch, so every owned partition gets its turn. 0 (the
	// default): one per owned partition. Set it to what the runner's pool can give, minus the
	// relay's and the appends' needs.
	MaxConcurrentPartitions int

	// safetyNetTickFunc, if set, is called with each safety-net tick's number once every
	// projection was handed it. Tests only.
	safetyNetTickFunc func(n int)
}

// ErrRunTwice is returned by a second Run of one Worker: its Running signal fires once.
var ErrRunTwice = errors.New("worker: Run was called before on this worker; a Worker runs once: create a new one with worker.New")

// ErrNotReadableYet reports a trigger whose position the event store cannot read yet because an
// older transaction is still open; the trigger is retried, never dead-lettered.
var ErrNotReadableYet = errors.New("worker: the trigger's events are not readable yet (an open transaction holds the store's readers back)")

// ErrDeadLetterTimeout reports a dead-letter write that did not finish within
// Config.DeadLetterTimeout; the trigger is nacked and comes back.
var ErrDeadLetterTimeout = errors.New("worker: the dead-letter write did not finish within DeadLetterTimeout (is the dead-letter database reachable?); the trigger is nacked and comes back")

// Worker runs projections from triggers.
type Worker struct {
	cfg     Config
	names   []string
	logger  *slog.Logger
	tracer  *tracing.Tracer
	stats   map[string]*counters
	running chan struct{}
	// ran is set by the first Run or RunBackground.
	ran atomic.Bool
	// created is when New made the worker: its replay at start replays the dead letters
	// written before (by earlier deployments), not those its own first triggers wrote.
	created time.Time
	// routers holds the routers AddHandlers added handlers to: RunBackground waits until they run.
	routersMu sync.Mutex
	routers   []*message.Router
	// parts holds the partitioned projections' partition sets, by projection name.
	parts map[string]*partitionSet
	// slots holds a token per partition batch running (MaxConcurrentPartitions); nil: no bound.
	slots chan struct{}
	// partitionOf names the projection of each partition unit.
	partitionOf map[string]string
	// retired undeclares the subscriptions of the versions the projections replaced.
	retired *retiredSubscriptions
	// healer resolves the dead letters the projections passed, off the trigger path.
	healer *healer
	// sleepFunc waits before a trigger whose dead letter failed is nacked (backoff.Sleep).
	sleepFunc func(ctx context.Context, d time.Duration) error
	// startClears holds a *startClear per projection (clearCrashLoopOnStart).
	startClears sync.Map
}

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a Config it cannot use.
var ErrInvalidConfig = errors.New("worker: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.SafetyNetInterval = cmp.Or(cfg.SafetyNetInterval, SafetyNetIntervalDefault)
	cfg.Retry = cfg.Retry.WithDefaults()
	cfg.CloseTimeout = cmp.Or(cfg.CloseTimeout, CloseTimeoutDefault)
	cfg.StallAfter = cmp.Or(cfg.StallAfter, StallAfterDefault)
	cfg.HorizonPollInterval = cmp.Or(cfg.HorizonPollInterval, HorizonPollIntervalDefault)
	cfg.HorizonWarnAfter = cmp.Or(cfg.HorizonWarnAfter, HorizonWarnAfterDefault)
	cfg.HorizonWait = cmp.Or(cfg.HorizonWait, HorizonWaitDefault)
	cfg.DeadLetterTimeout = cmp.Or(cfg.DeadLetterTimeout, DeadLetterTimeoutDefault)
	if cfg.TransientCauseFunc == nil {
		cfg.TransientCauseFunc = TransientCause
	}
	if cfg.Leases != nil {
		l := *cfg.Leases
		if l.Owner == "" { // one owner id for every projection of the worker
			l.Owner = lease.Config{}.WithDefaults().Owner
		}
		cfg.Leases = &l
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.Runner == nil || cfg.Channel == nil || cfg.DeadLetters == nil {
		return fmt.Errorf("%w: worker.New needs a Runner, a Channel and DeadLetters (deadletter/postgres, or deadletter/memory in tests)",
			ErrInvalidConfig)
	}
	if err := cfg.Retry.Validate(); err != nil {
		return fmt.Errorf("%w: Retry: %w", ErrInvalidConfig, err)
	}
	if cfg.CloseTimeout < 0 || cfg.StallAfter < 0 || cfg.HorizonWarnAfter < 0 || cfg.HorizonWait < 0 {
		return fmt.Errorf("%w: CloseTimeout (%s), StallAfter (%s), HorizonWarnAfter (%s) and HorizonWait (%s) must not be negative",
			ErrInvalidConfig, cfg.CloseTimeout, cfg.StallAfter, cfg.HorizonWarnAfter, cfg.HorizonWait)
	}
	if cfg.MaxConcurrentPartitions < 0 {
		return fmt.Errorf("%w: MaxConcurrentPartitions (%d) must not be negative", ErrInvalidConfig, cfg.MaxConcurrentPartitions)
	}
	if cfg.Leases != nil && cfg.Leases.DB == nil {
		return fmt.Errorf("%w: Leases needs a DB (the database of the lease tables)", ErrInvalidConfig)
	}
	if cfg.DeadLetterTimeout < 0 {
		return fmt.Errorf("%w: DeadLetterTimeout (%s) must not be negative", ErrInvalidConfig, cfg.DeadLetterTimeout)
	}
	for _, name := range cfg.Projections {
		if _, err := cfg.Runner.Projection(name); err != nil {
			return fmt.Errorf("%w: Projections: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

// New returns a worker. It connects to nothing until Prepare or Run.
func New(cfg Config) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	names := cfg.Projections
	if len(names) == 0 {
		names = cfg.Runner.Names()
	}
	w := &Worker{cfg: cfg, names: slices.Clone(names), logger: tracing.Logger(cfg.Logger), tracer: tracing.New(cfg.TracerProvider), stats: make(map[string]*counters, len(names)), created: time.Now(),
		running: make(chan struct{}), parts: map[string]*partitionSet{}, partitionOf: map[string]string{},
		retired: newRetiredSubscriptions(cfg.Channel, names, cfg.Logger)}
	w.healer, w.sleepFunc = newHealer(w), backoff.Sleep
	if cfg.MaxConcurrentPartitions > 0 {
		w.slots = make(chan struct{}, cfg.MaxConcurrentPartitions)
	}
	for _, name := range names {
		c := &counters{}
		w.stats[name] = c
		p, _ := cfg.Runner.Projection(name) // checked by Validate
		if !p.Partitioned() {
			continue
		}
		ps, err := w.newPartitionSet(p, cfg.Leases)
		if err != nil {
			return nil, err
		}
		w.parts[name] = ps
		for _, unit := range ps.units {
			w.stats[unit] = c // a partition's counts are its projection's
			w.partitionOf[unit] = name
		}
	}
	return w, nil
}

// Stats counts what one projection's handler did with its triggers.
type Stats struct {
	// Received counts triggers delivered to the handler (redeliveries included).
	Received int64
	// Redundant counts triggers for positions or types the projection had already passed: they
	// cost no read.
	Redundant int64
	// Ignored counts triggers addressed to another projection.
	Ignored int64
	// Invalid counts triggers that could not be decoded (dead-lettered at once).
	Invalid int64
	// CatchUps counts catch-ups run for triggers, at start-up and by the safety net.
	CatchUps int64
	// Failures counts catch-ups that returned an error.
	Failures int64
	// DeadLettered counts triggers handed to the dead letters.
	DeadLettered int64
	// Healed counts dead letters resolved because the projection passed their failing event
	// by itself (deadletter.Store.ResolvePassed).
	Healed int64
	// Stalls counts the stalls the safety net found (see Config.StallAfter).
	Stalls int64
	// Partitions is how many partitions of a partitioned projection the worker owns now (0 for
	// an unpartitioned one); PartitionsClaimed and PartitionsGivenBack count the partitions it
	// took and gave back (rebalances, takeovers, its own stop).
	Partitions                             int
	PartitionsClaimed, PartitionsGivenBack int64
}

type counters struct {
	received, redundant, ignored, invalid, catchUps, failures, deadLettered, healed, stalls atomic.Int64
	claimed, givenBack                                                                      atomic.Int64
	// running counts catch-ups in flight; runningSince is when the count last left zero;
	// triggered is when a trigger last started a catch-up (Unix nanoseconds).
	running      atomic.Int32
	runningSince atomic.Int64
	triggered    atomic.Int64
	// deadLetterFailures counts the dead-letter writes that failed in a row (deadLetterFailed);
	// deadLetterWaits counts the waits after them.
	deadLetterFailures, deadLetterWaits atomic.Int64
}

// Stats returns the counters of the named projection's handler.
func (w *Worker) Stats(name string) Stats {
	c, ok := w.stats[name]
	if !ok {
		return Stats{}
	}
	st := Stats{Received: c.received.Load(), Redundant: c.redundant.Load(), Ignored: c.ignored.Load(),
		Invalid: c.invalid.Load(), CatchUps: c.catchUps.Load(), Failures: c.failures.Load(), DeadLettered: c.deadLettered.Load(),
		Healed: c.healed.Load(), Stalls: c.stalls.Load(), PartitionsClaimed: c.claimed.Load(), PartitionsGivenBack: c.givenBack.Load()}
	if ps, ok := w.parts[name]; ok {
		st.Partitions = len(ps.owned())
	}
	return st
}

// Prepare does what must happen before the projections' handlers run, on a router of yours
// (before AddHandlers) as in Run: it registers the projections (Runner.Init: status rows, init
// hooks), checks that the dead letters can be read, and declares the projections' subscriptions
// on the channel, so no trigger published after it returns is lost. What fails here would fail
// every catch-up: a database where Migrate never ran (errors matching projection.ErrNotMigrated,
// eventstore.ErrNotMigrated or deadletter.ErrNotMigrated say so), an init hook's error, a channel
// that cannot declare. Safe to call again (at every start, from several processes at once).
func (w *Worker) Prepare(ctx context.Context) error {
	began := time.Now()
	if err := w.cfg.Runner.Init(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	initialised := time.Now()
	if _, err := w.cfg.DeadLetters.List(ctx, deadletter.Filter{Limit: 1}); err != nil {
		return fmt.Errorf("worker: read the dead letters: %w", err)
	}
	if err := w.checkLeases(ctx); err != nil {
		return err
	}
	declaring := time.Now()
	if err := w.declare(ctx); err != nil {
		return err
	}
	w.logger.Info("worker: prepared", slog.Int("projections", len(w.names)), slog.Int("subscriptions", len(w.subscriptionNames())),
		slog.Duration("init_took", initialised.Sub(began)), slog.Duration("declare_took", time.Since(declaring)))
	return nil
}

// AddHandlers adds one handler per projection to router, named "nudge.<projection>", each
// consuming the projection's own subscription, with handler-level middleware from package
// retry: dead-lettering outermost, then retries with backoff, then panic recovery (a
// router-level Recoverer would turn a panic into an endless redelivery loop). Give the router
// RouterLogger(…) as its logger, so that its lines about these handlers name the projection.
// RunBackground waits until router runs before it replays dead letters.
func (w *Worker) AddHandlers(router *message.Router) error {
	if router == nil {
		return fmt.Errorf("%w: worker.AddHandlers needs a router", ErrInvalidConfig)
	}
	w.routersMu.Lock()
	w.routers = append(w.routers, router)
	w.routersMu.Unlock()
	for _, name := range w.names {
		sub, topic, err := w.cfg.Channel.Subscriber(name)
		if err != nil {
			return fmt.Errorf("worker: subscriber of %s: %w", name, err)
		}
		mw, err := w.middleware(name)
		if err != nil {
			return err
		}
		router.AddConsumerHandler(HandlerPrefix+name, topic, sub, w.handlerOf(name).handle).AddMiddleware(mw...)
	}
	return nil
}

// shouldDeadLetter says which errors dead-letter a trigger after its retries: undecodable
// triggers, handler failures (a crash loop included) and panics. Everything else — a database or
// broker that is down, a position not readable yet — is nacked, so the trigger comes back; a
// shutdown is never dead-lettered. A handler failure that is an outage (projection.IsOutage: the
// handler's own connection dropped, say, as a database crash does) is nacked too: outages are
// never dead-lettered.
func shouldDeadLetter(err error) bool {
	if errors.Is(err, projection.ErrHandler) && projection.IsOutage(err) {
		return false
	}
	return retry.ShouldDeadLetterDefault(err) || errors.Is(err, trigger.ErrInvalid) || errors.Is(err, projection.ErrHandler)
}

func (w *Worker) deadLetter(name string, msg *message.Message, cause error) error {
	log := w.logger.With(slog.String("projection", name), slog.String("message_uuid", msg.UUID))
	entry := deadletter.Entry{Projection: name, MessageUUID: msg.UUID, Payload: msg.Payload, Metadata: msg.Metadata,
		Error: cause.Error(), At: time.Now()}
	var he *projection.HandlerError
	if errors.As(cause, &he) {
		entry.FailingEvent = &he.Event
	}
	var gaveUp *retry.GiveUpError
	if errors.As(cause, &gaveUp) {
		entry.Attempts = gaveUp.Attempts
	}
	if he != nil {
		if why := w.cfg.TransientCauseFunc(he.Err); why != "" {
			entry.Metadata = maps.Clone(entry.Metadata)
			if entry.Metadata == nil {
				entry.Metadata = map[string]string{}
			}
			entry.Metadata[deadletter.MetadataTransient] = why
		}
	}
	ctx, cancel := context.WithTimeout(msg.Context(), w.cfg.DeadLetterTimeout)
	defer cancel()
	rec, err := w.cfg.DeadLetters.Add(ctx, entry)
	if err != nil {
		if ctx.Err() != nil && msg.Context().Err() == nil {
			err = fmt.Errorf("%w (%s): %w", ErrDeadLetterTimeout, w.cfg.DeadLetterTimeout, err)
		} else {
			err = fmt.Errorf("worker: store the dead letter: %w", err)
		}
		w.deadLetterFailed(msg.Context(), w.stats[name], log) // no hot loop against a refusing store
		return err
	}
	w.stats[name].deadLetterFailures.Store(0)
	w.stats[name].deadLettered.Add(1)
	attrs := []any{slog.Int64("dead_letter_id", rec.ID), slog.Int("count", rec.Count), slog.Any("error", cause)}
	if he != nil {
		attrs = append(attrs, slog.String("event_id", he.Event.ID.String()), slog.String("event_type", he.Event.Type),
			slog.String("position", he.Event.Position.String()))
	}
	log.WarnContext(msg.Context(), "trigger dead-lettered", attrs...)
	return nil
}

// replayOnStart does the start-up work on each projection's dead letters (startDeadLetters),
// then, unless Config.DisableReplayOnStart, redrives its parked streams.
func (w *Worker) replayOnStart(ctx context.Context) {
	for _, name := range w.names {
		log := w.logger.With(slog.String("projection", name))
		if err := w.clearCrashLoopOnStart(ctx, name); err != nil && ctx.Err() == nil {
			log.ErrorContext(ctx, "clearing the crash-loop verdict at start failed; the replay's trigger clears it", slog.Any("error", err))
		}
		w.startDeadLetters(ctx, name, log)
		if ps, ok := w.parts[name]; ok {
			for _, unit := range ps.units { // a partition's dead letters are its unit's
				w.startDeadLetters(ctx, unit, log.With(slog.String("unit", unit)))
			}
		}
		if !w.cfg.DisableReplayOnStart {
			w.redrive(ctx, name, "", "worker start", log)
		}
	}
}

// startDeadLetters replays the projection's dead letters ("replay after deploy"; a replayed
// trigger's catch-up passes the events of the transient ones too) within ReplayOnStartTimeout
// (records it did not reach wait for the next start, and a stalled database does not hold the
// safety net back), or, with DisableReplayOnStart, has the healer resolve those the projection
// has passed since they were written (by another process, or before a crash right after a
// commit).
func (w *Worker) startDeadLetters(parent context.Context, name string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(parent, ReplayOnStartTimeout)
	defer cancel()
	if w.cfg.DisableReplayOnStart {
		if st, err := w.cfg.Runner.Status(ctx, name); err == nil {
			w.healer.signal(name, st.Position)
		} else if parent.Err() == nil {
			log.WarnContext(ctx, "could not read the projection's position to resolve healed dead letters", slog.Any("error", err))
		}
		return
	}
	// The replayed triggers carry the replay's trace context: their trigger spans are its children.
	res, err := deadletter.Replay(ctx, w.cfg.DeadLetters, w.cfg.Channel, deadletter.ReplayFilter{Projection: name, FailedBefore: w.created},
		"worker start", time.Now(), deadletter.WithTracerProvider(w.cfg.TracerProvider))
	switch {
	case err != nil && parent.Err() == nil:
		log.ErrorContext(ctx, "replaying dead letters at start failed", slog.Any("error", err))
	case res.Replayed > 0:
		log.InfoContext(ctx, "replayed dead letters at start", slog.Int("records", res.Replayed))
	}
}

// redrive redrives the projection's parked stream (every parked stream when stream is "")
// and logs the outcome; a stream whose redrive fails stays parked with the new error.
func (w *Worker) redrive(ctx context.Context, name, stream, by string, log *slog.Logger) {
	var (
		n   int
		err error
	)
	if stream == "" {
		n, err = w.cfg.Runner.RedriveAll(ctx, name, by)
	} else if _, err = w.cfg.Runner.Redrive(ctx, name, stream, by); err == nil {
		n = 1
	}
	switch {
	case errors.Is(err, projection.ErrNotParked):
		log.WarnContext(ctx, "redrive request: the stream is not parked", slog.String("stream_id", stream), slog.String("by", by))
	case err != nil && ctx.Err() == nil:
		log.ErrorContext(ctx, "redriving parked streams failed; they stay parked", slog.String("by", by), slog.Any("error", err))
	case n > 0:
		log.InfoContext(ctx, "redrove parked streams", slog.Int("streams", n), slog.String("by", by))
	}
}

// handlerOf returns the trigger handler of the named projection's own subscription. A
// partitioned projection's is for the requests addressed to the projection (skip, rebuild,
// replay, redrive): it carries them out and triggers every partition, whose owners catch up;
// the partitions' own subscriptions take the append triggers.
func (w *Worker) handlerOf(name string) *projectionHandler {
	p, _ := w.cfg.Runner.Projection(name) // checked in New
	h := &projectionHandler{w: w, name: name, types: p.Types(), c: w.stats[name], log: w.logger.With(slog.String("projection", name))}
	if ps, ok := w.parts[name]; ok {
		h.parts = ps
		h.run = func(ctx context.Context) (projection.Result, error) {
			return projection.Result{}, w.nudgePartitions(ctx, ps)
		}
	} else {
		h.run = func(ctx context.Context) (projection.Result, error) { return w.cfg.Runner.CatchUp(ctx, name) }
	}
	return h
}

// TriggerReport is an append trigger as a projection's handler received it, for
// Config.TriggerFunc.
type TriggerReport struct {
	// Projection is the projection's name, or its partition unit's.
	Projection string
	// Trigger is the decoded trigger; Trigger.At is when its publisher made it.
	Trigger trigger.Trigger
	// Received is when the handler decoded it, in this host's clock.
	Received time.Time
}

// projectionHandler handles the triggers of one subscription: a projection's, or a partition
// unit's (name is then the unit's).
type projectionHandler struct {
	w     *Worker
	name  string
	types []string
	c     *counters
	log   *slog.Logger
	// run catches the subscription's projection or partition up.
	run func(ctx context.Context) (projection.Result, error)
	// parts is set on the own subscription of a partitioned projection.
	parts *partitionSet
	// partition is a partition unit's part of the log (zero: the whole log).
	partition eventstore.Partition
	// refreshed is when a backlog's redundant trigger last started a catch-up (refreshDue).
	refreshed atomic.Int64
}

func (h *projectionHandler) handle(msg *message.Message) error {
	h.c.received.Add(1)
	// The trigger's span is a child of the publisher's (the relay's, or the append's), whose
	// trace context the message carries.
	ctx, span := h.w.tracer.Start(tracing.Extract(msg.Context(), msg.Metadata), tracing.SpanTrigger, trace.SpanKindConsumer)
	if span.IsRecording() {
		// The dead-letter middleware's lines about the trigger join its (last) span too.
		msg.SetContext(ctx)
	}
	t, err := trigger.FromMessage(msg)
	if err != nil {
		h.c.invalid.Add(1)
		err = retry.Permanent(err) // the same bytes can never decode: dead-letter at once
	} else {
		err = h.process(ctx, t)
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrProjection.String(h.name), tracing.AttrReason.String(string(t.Reason)),
			tracing.AttrPositionTo.String(t.Position.String()), tracing.AttrMessagingOperation.String("process"),
			tracing.AttrMessagingMessageID.String(msg.UUID), tracing.AttrMessagingConsumer.String(h.name))
	}
	tracing.End(span, err)
	return err
}

// process handles the trigger t.
func (h *projectionHandler) process(ctx context.Context, t trigger.Trigger) error {
	if fn := h.w.cfg.TriggerFunc; fn != nil && t.Reason == trigger.ReasonAppend {
		fn(TriggerReport{Projection: h.name, Trigger: t, Received: time.Now()})
	}
	if err := h.w.clearCrashLoopOnStart(ctx, h.name); err != nil {
		return err // nacked: comes back
	}
	if passed, redundant := h.passed(t); passed {
		if redundant && h.refreshDue(t) {
			// A backlog of stale triggers (queued through a long catch-up, a version's build,
			// an outage) is worked through one by one; the triggers of new events wait behind
			// it. A catch-up now and then while it drains handles those events meanwhile.
			return h.w.catchUp(ctx, h)
		}
		return nil
	}
	switch t.Reason {
	case trigger.ReasonSkip:
		return h.skip(ctx, t.Skip)
	case trigger.ReasonRebuild:
		return h.rebuild(ctx, t)
	case trigger.ReasonReplay:
		// An operator replays after a fix: an event judged to kill the process gets another go.
		if err := h.w.cfg.Runner.ClearCrashLoop(ctx, h.name); err != nil {
			return fmt.Errorf("projection %s: clear the crash-loop verdict for a replay: %w", h.name, err)
		}
	case trigger.ReasonRedrive:
		// An operator redrives parked streams after a fix; a failed redrive is recorded on the
		// parked record and acked: the stream stays parked, the operator sees the new error.
		h.w.redrive(ctx, h.name, t.Redrive.Stream, t.Redrive.By, h.log)
	}
	return h.catchUpTo(ctx, t.Position)
}

const (
	// backlogAge: a redundant append trigger made longer ago than this comes from a backlog.
	backlogAge = 100 * time.Millisecond
	// backlogRefresh is how often a backlog's redundant triggers start a catch-up.
	backlogRefresh = 20 * time.Millisecond
)

// refreshDue reports whether t, a redundant append trigger, should start a catch-up all the same: it
// was made over backlogAge ago, so triggers queued behind it may be waiting for new events, and
// no redundant trigger started one in the last backlogRefresh. Redundant triggers made just now
// (a burst) cost no read.
func (h *projectionHandler) refreshDue(t trigger.Trigger) bool {
	if t.At.IsZero() || time.Since(t.At) < backlogAge {
		return false
	}
	now, last := time.Now().UnixNano(), h.refreshed.Load()
	return now-last >= int64(backlogRefresh) && h.refreshed.CompareAndSwap(last, now)
}

// passed reports (and counts) a trigger addressed to another projection, or one for a position
// or event types the projection has already passed, or (on a partition's subscription) for
// streams of other partitions only: such a trigger costs no read. redundant
// is true for the latter, append triggers.
func (h *projectionHandler) passed(t trigger.Trigger) (passed, redundant bool) {
	if (t.Projection != "" && t.Projection != h.name) || (t.Projection == "" && h.parts != nil) {
		// Another projection's, or an append trigger on a partitioned projection's own
		// subscription: its partitions' subscriptions have it too.
		h.c.ignored.Add(1)
		return true, false
	}
	if t.Reason == trigger.ReasonAppend && !t.Position.IsZero() &&
		(!h.w.cfg.Runner.CommittedPosition(h.name).Less(t.Position) || !t.Concerns(h.types) || !t.ConcernsPartition(h.partition)) {
		h.c.redundant.Add(1)
		return true, true
	}
	return false, false
}

// catchUpTo catches the projection up once pos is readable (or HorizonWait has passed: then it
// catches up what it can and fails, so the trigger comes back).
func (h *projectionHandler) catchUpTo(ctx context.Context, pos eventstore.Position) error {
	readable, err := h.w.waitReadable(ctx, pos)
	if err != nil {
		return err
	}
	h.c.triggered.Store(time.Now().UnixNano())
	if err := h.w.catchUp(ctx, h); err != nil {
		if errors.Is(err, projection.ErrCrashLoop) {
			return retry.Permanent(err) // handled no more until a replay: retrying cannot help
		}
		return err
	}
	if !readable {
		return fmt.Errorf("projection %s: trigger at %s: %w", h.name, pos, ErrNotReadableYet)
	}
	return nil
}

// skip performs an operator's skip request with the projection's definition (its on-skip hook
// runs), then catches up. A refused skip is logged and acked: the request was wrong, retrying
// it cannot help; the operator sees in the projection's status that nothing was skipped.
func (h *projectionHandler) skip(ctx context.Context, req *trigger.SkipRequest) error {
	w, name, log := h.w, h.name, h.log
	e, err := w.cfg.Runner.Skip(ctx, name, req.EventID, projection.SkipOptions{Reason: req.Reason, By: req.By, Force: req.Force})
	if errors.Is(err, projection.ErrSkipRefused) {
		log.WarnContext(ctx, "skip request refused", slog.String("event_id", req.EventID.String()), slog.String("by", req.By), slog.Any("error", err))
		return nil
	}
	if err != nil {
		return err
	}
	log.InfoContext(ctx, "skip request done", slog.String("event_id", e.ID.String()), slog.String("by", req.By))
	return w.catchUp(ctx, h)
}

// rebuild performs an operator's rebuild request with the projection's definition: Runner.Reset
// (its reset hook runs) and then a catch-up from the start, inside the handler, so the trigger
// is acked once the rebuild has caught up (keep the channel's ack deadline in mind for long
// rebuilds: a redelivery only joins the catch-up).
//
// A redelivered request must not start the same rebuild again, so the projection is reset only
// if its last rebuild started before the request's time (t.At); otherwise it only catches up.
// Both times come from the database's clock: the reset stamps RebuildStartedAt with the
// database's now(), and the CLI takes At from the database too (see trigger.ReasonRebuild).
func (h *projectionHandler) rebuild(ctx context.Context, t trigger.Trigger) error {
	w, name, log := h.w, h.name, h.log
	var by string
	if t.Rebuild != nil {
		by = t.Rebuild.By
	}
	st, err := w.cfg.Runner.Status(ctx, name)
	if err != nil {
		return fmt.Errorf("rebuild request: %w", err)
	}
	attrs := []any{slog.String("by", by), slog.Time("requested_at", t.At)}
	if st.RebuildStartedAt.Before(t.At) {
		if err := w.cfg.Runner.Reset(ctx, name); err != nil {
			err = fmt.Errorf("rebuild request: %w", err) // err names the projection
			if ctx.Err() != nil {
				return err // shutting down: the request comes back
			}
			// The reset rolled back whole. The request is dead-lettered at once, with the error,
			// where the operator (and `nudge rebuild`, which is waiting) sees it; after the fix
			// the operator asks again.
			return retry.Permanent(err)
		}
		log.InfoContext(ctx, "rebuild request: projection reset, rebuilding", attrs...)
	} else {
		log.InfoContext(ctx, "rebuild request already carried out; catching up",
			append(attrs, slog.Time("rebuild_started_at", st.RebuildStartedAt))...)
	}
	if err := w.catchUp(ctx, h); err != nil {
		if errors.Is(err, projection.ErrCrashLoop) {
			return retry.Permanent(err) // as for any trigger: handled no more until a replay
		}
		return err
	}
	return nil
}

// waitReadable waits, up to HorizonWait, until the store can read up to pos, and reports
// whether it can. Without a Store, or for a trigger without a position, it reports true at once.
func (w *Worker) waitReadable(ctx context.Context, pos eventstore.Position) (bool, error) {
	if w.cfg.Store == nil || pos.IsZero() {
		return true, nil
	}
	deadline := time.Now().Add(w.cfg.HorizonWait)
	wait := backoff.Exponential{Initial: 2 * time.Millisecond, Max: 100 * time.Millisecond}
	for {
		head, err := w.head(ctx, deadline)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return false, nil // HorizonWait is over, stalled or not
		}
		if err != nil {
			return false, fmt.Errorf("worker: read the store's head: %w", err)
		}
		if !head.Less(pos) {
			return true, nil
		}
		pause := wait.Next()
		if time.Now().Add(pause).After(deadline) {
			return false, nil
		}
		if err := backoff.Sleep(ctx, pause); err != nil {
			return false, err
		}
	}
}

// head reads the store's head, giving up at deadline.
func (w *Worker) head(ctx context.Context, deadline time.Time) (eventstore.Position, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return w.cfg.Store.Head(ctx)
}

// catchUp runs h's catch-up (its projection's, or its partition's) and counts it.
func (w *Worker) catchUp(ctx context.Context, h *projectionHandler) error {
	name, log, c := h.name, h.log, h.c
	c.catchUps.Add(1)
	if c.running.Add(1) == 1 {
		c.runningSince.Store(time.Now().UnixNano())
	}
	defer c.running.Add(-1)
	res, err := h.run(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.failures.Add(1)
		}
		return err
	}
	if res.Events > 0 {
		log.DebugContext(ctx, "projection caught up", slog.Int("events", res.Events), slog.String("position", res.Position.String()))
		w.healer.signal(name, res.Position) // never waits for the dead-letter store
	}
	w.retired.afterCatchUp(ctx, w.cfg.Runner, cmp.Or(w.partitionOf[name], name), res)
	return nil
}

// Running is closed once the handlers are subscribed (by Run, or, for handlers on your router,
// once RunBackground saw that router run): from then on no trigger is missed, even on channels
// that keep nothing for absent consumers.
func (w *Worker) Running() <-chan struct{} { return w.running }

// RunBackground runs what the worker does besides its handlers, until ctx ends: it waits until
// every router given to AddHandlers runs, then replays the projections' dead letters ("replay
// after deploy", unless Config.DisableReplayOnStart: a fix that was just deployed takes effect
// without an operator, and a crash-loop verdict is cleared the same way), catches every
// projection up and runs the safety net, and watches the store's horizon (Config.Horizon). Call
// it (on a goroutine of its own) when the handlers run on your router; Run calls it itself.
//
// A Worker runs once, by Run or by RunBackground: a second call returns ErrRunTwice.
func (w *Worker) RunBackground(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	w.background(ctx)
	return nil
}

// background is RunBackground's work.
func (w *Worker) background(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.watchHorizon(ctx) })
	wg.Go(func() { w.healer.run(ctx) })
	w.routersMu.Lock()
	routers := slices.Clone(w.routers)
	w.routersMu.Unlock()
	for _, r := range routers {
		select {
		case <-r.Running():
		case <-ctx.Done():
			return
		}
	}
	close(w.running)
	wg.Go(func() { w.runPartitions(ctx) })
	w.replayOnStart(ctx)
	w.safetyNet(ctx)
}

// Run does everything with a router of its own, until ctx ends: Prepare, AddHandlers, the
// router, and RunBackground's duties; then it stops the router (handlers in flight finish or
// roll back, within CloseTimeout) and returns nil. What fails in Prepare is returned at once,
// before any handler runs. A Worker runs once: a second Run returns ErrRunTwice.
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	if err := w.Prepare(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: w.cfg.CloseTimeout}, RouterLogger(watermill.NewSlogLogger(w.logger)))
	if err != nil {
		return fmt.Errorf("worker: router: %w", err)
	}
	if err := w.AddHandlers(router); err != nil {
		return err
	}
	if w.cfg.RouterFunc != nil {
		if err := w.cfg.RouterFunc(router); err != nil {
			return fmt.Errorf("worker: RouterFunc: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { w.background(ctx) })
	err = router.Run(ctx)
	cancel()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("worker: router: %w", err)
	}
	return nil
}
