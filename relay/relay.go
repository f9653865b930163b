// Package relay publishes triggers for appended events. A Relay tails the event store from a
// durable position of its own and publishes one coalesced trigger per batch of events, with any
// channel; an Appender publishes an append's trigger inside the append's transaction, with the
// PostgreSQL-queue channel. Either way, once an append commits, every projection eventually gets
// a trigger.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/reserved"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

// Defaults for Config.
const (
	// NameDefault is the relay's projection name (its position and status row).
	NameDefault = "nudge-relay"
	// BatchSizeDefault is the most events one relay batch covers with one trigger.
	BatchSizeDefault = 1000
	// MinIntervalDefault is the relay's wait after it published, less the time the publish
	// took.
	MinIntervalDefault = 5 * time.Millisecond
	// MaxIntervalDefault caps the relay's wait while nothing is appended.
	MaxIntervalDefault = 25 * time.Millisecond
	// MaxBusyIntervalDefault is the relay's wait after a batch that covered BatchSize events:
	// under a heavy load the relay waits longer and each trigger covers more events.
	MaxBusyIntervalDefault = 25 * time.Millisecond
	// ListeningMaxIntervalDefault caps the relay's idle wait while its Waker listens: the
	// poll is then a fallback for wake-ups that find the events not readable yet.
	ListeningMaxIntervalDefault = time.Second
)

// Config configures a Relay. Every field is optional.
type Config struct {
	// Name is the relay's projection name. Defaults to NameDefault. Run one relay name per
	// channel. It must start with name.ReservedPrefix ("nudge-"), which projection.New refuses,
	// so no projection can take the relay's position and status row.
	Name string
	// BatchSize is the most events covered by one trigger. Defaults to BatchSizeDefault.
	BatchSize int
	// MinInterval and MaxInterval bound the relay's polling: it waits MinInterval after work and
	// doubles the wait while idle, up to MaxInterval, which bounds the latency an idle relay
	// adds. Default to MinIntervalDefault and MaxIntervalDefault. The wait after work counts
	// the time its publishes took: a publish that waits for the broker's confirm (RabbitMQ)
	// or commits a transaction of its own (the PostgreSQL queue), a few milliseconds under
	// load, already spaced the relay's polls out, and events appended meanwhile would
	// otherwise wait for it and then MinInterval more.
	MinInterval, MaxInterval time.Duration
	// MaxBusyInterval stretches the wait after work with the events the relay found: from
	// MinInterval after a few events to MaxBusyInterval after a full batch (see
	// projection.PollerConfig.MaxBusyInterval). At 1,000 appends a second the relay still
	// waits about MinInterval; under a heavy load it polls and publishes several times less
	// often, which the appenders, the broker and every projection's catch-ups feel (make bench
	// measures it). Defaults to MaxBusyIntervalDefault, or MinInterval if that is longer.
	MaxBusyInterval time.Duration
	// Waker, if set, wakes the relay when events are appended, by any process: a
	// postgres.Listener on postgres.NotifyEvents (nudge.Client sets one up). An idle relay then
	// publishes a round trip after the append's commit, and while the Waker listens its idle
	// wait grows up to ListeningMaxInterval instead of MaxInterval, so it costs next to no
	// queries; while it does not (connection lost), the relay polls as without it.
	Waker projection.Waker
	// ListeningMaxInterval caps the idle wait while Waker listens. Defaults to
	// ListeningMaxIntervalDefault, or MaxInterval if that is longer.
	ListeningMaxInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// BeforePublishFunc, if set, runs before each publish; tests use it to stop a process
	// between an append's commit and the trigger's publish.
	BeforePublishFunc func(t trigger.Trigger)
	// AfterPollFunc, if set, is called after each of the relay's polls, with what it found
	// and the wait chosen (see projection.PollerConfig.AfterPollFunc).
	AfterPollFunc func(p projection.PollParams)
	// BatchFunc, if set, is called after each of the relay's batches that published a trigger
	// (or failed), with the batch's report: its Projection is the relay's Name, and its
	// Staleness holds, per event, the relay's delay — from the event's recording to the commit
	// of the relay's position after the trigger's publish, both in the database's clock.
	// metrics.Metrics.ObserveRelay records it (nudge.Config.Metrics wires it).
	BatchFunc func(b projection.BatchReport)
	// TracerProvider receives a span per trigger published (nudge.relay.publish); the
	// trigger carries its trace context to the projections' trigger spans. Defaults to
	// otel.GetTracerProvider() (a no-op unless the application sets one).
	TracerProvider trace.TracerProvider
}

// ErrInvalidConfig is matched (errors.Is) by every error New and NewAppender return for a
// Config or a dependency they cannot use; the message names the field and what to do.
var ErrInvalidConfig = errors.New("relay: invalid config")

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.Name = cmp.Or(cfg.Name, NameDefault)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, BatchSizeDefault)
	cfg.MinInterval = cmp.Or(cfg.MinInterval, MinIntervalDefault)
	cfg.MaxInterval = cmp.Or(cfg.MaxInterval, MaxIntervalDefault)
	cfg.MaxBusyInterval = cmp.Or(cfg.MaxBusyInterval, max(MaxBusyIntervalDefault, cfg.MinInterval))
	cfg.ListeningMaxInterval = cmp.Or(cfg.ListeningMaxInterval, max(ListeningMaxIntervalDefault, cfg.MaxInterval))
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if !strings.HasPrefix(cfg.Name, name.ReservedPrefix) {
		return fmt.Errorf("%w: Name %q must start with %q, which no projection can take, so no projection can share the relay's position; use %q, or %q plus a name per channel",
			ErrInvalidConfig, cfg.Name, name.ReservedPrefix, NameDefault, name.ReservedPrefix)
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > eventstore.ReadLimitMax {
		return fmt.Errorf("%w: BatchSize %d out of range; use 1 to %d (0 means %d)",
			ErrInvalidConfig, cfg.BatchSize, eventstore.ReadLimitMax, BatchSizeDefault)
	}
	if cfg.MinInterval <= 0 || cfg.MaxInterval < cfg.MinInterval || cfg.MaxBusyInterval < cfg.MinInterval {
		return fmt.Errorf("%w: intervals must satisfy 0 < MinInterval <= MaxInterval, MaxBusyInterval (got %s, %s, %s; 0 means the default)",
			ErrInvalidConfig, cfg.MinInterval, cfg.MaxInterval, cfg.MaxBusyInterval)
	}
	if cfg.ListeningMaxInterval < cfg.MaxInterval {
		return fmt.Errorf("%w: ListeningMaxInterval %s is below MaxInterval %s (0 means the default)", ErrInvalidConfig, cfg.ListeningMaxInterval, cfg.MaxInterval)
	}
	return nil
}

// Relay publishes triggers for appended events by tailing the event store from a durable
// position of its own: it is a projection (status row, lag, lock) whose batches publish one
// coalesced trigger for all the events they read (without their payloads), then commit the
// position. A trigger is published before its position commits, so a crash between the two
// repeats a trigger, never loses one: once an append commits, every projection eventually gets
// a trigger, even if the appending process dies right after the commit.
//
// Appends write nothing more for it (beside the one notification per transaction the store
// sends for every listener), and the broker sees one trigger per relay batch however fast
// events are appended. Its cost is the reads and publishes themselves, which share the
// machine with the appenders, and a poll every MinInterval to MaxInterval — while a Waker
// listens, up to ListeningMaxInterval.
//
// Several relays with the same name (one per worker process, say) are safe: the projection
// lock lets one publish a given batch.
type Relay struct {
	runner *projection.Runner
	poller *projection.Poller
	name   string
	// publishing is the time spent publishing since the poller last asked (WaitedFunc), in
	// nanoseconds.
	publishing atomic.Int64
	// running is set while Run runs.
	running atomic.Bool
}

// New returns a relay that reads events through backend and publishes to pub (a
// channel.Channel, say).
func New(backend projection.Backend, pub trigger.Publisher, cfg Config) (*Relay, error) {
	if backend == nil || pub == nil {
		return nil, fmt.Errorf("%w: relay.New needs a projection backend and a publisher", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{name: cfg.Name}
	tracer := tracing.New(cfg.TracerProvider)
	newProjection := reserved.NewProjection.(func(string, projection.Config, ...projection.Handler) (*projection.Projection, error))
	p, err := newProjection(cfg.Name, projection.Config{
		BatchSize:    cfg.BatchSize,
		OmitPayloads: true, // a trigger needs positions, types and streams only
		FlushFunc: func(ctx context.Context, fp projection.FlushParams) error {
			t := coalesce(fp.Events)
			if cfg.BeforePublishFunc != nil {
				cfg.BeforePublishFunc(t)
			}
			started := time.Now()
			err := publish(ctx, tracer, pub, t, len(fp.Events))
			r.publishing.Add(int64(time.Since(started)))
			if err != nil {
				return fmt.Errorf("relay: publish trigger up to %s: %w", t.Position, err)
			}
			return nil
		},
	}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	if err != nil {
		return nil, err
	}
	// The relay's own batches are not traced: most of its polls find nothing.
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: cfg.Logger, TracerProvider: noop.NewTracerProvider(),
		OnBatch: cfg.BatchFunc}, p)
	if err != nil {
		return nil, err
	}
	poller, err := projection.NewPoller(runner, projection.PollerConfig{
		MinInterval: cfg.MinInterval, MaxInterval: cfg.MaxInterval, MaxFailureInterval: max(time.Second, cfg.MaxInterval),
		MaxBusyInterval:      cfg.MaxBusyInterval,
		Waker:                cfg.Waker,
		ListeningMaxInterval: cfg.ListeningMaxInterval,
		AfterPollFunc:        cfg.AfterPollFunc,
		// The publishes of a catch-up count toward the wait after it: a broker's confirm
		// or a queue's commit spaces them out already.
		WaitedFunc: func(string) time.Duration { return time.Duration(r.publishing.Swap(0)) },
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	r.runner, r.poller = runner, poller
	return r, nil
}

// publish publishes t, the trigger of events events, in a span of its own.
func publish(ctx context.Context, tracer *tracing.Tracer, pub trigger.Publisher, t trigger.Trigger, events int) error {
	ctx, span := tracer.Start(ctx, tracing.SpanPublish, trace.SpanKindProducer)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrPositionTo.String(t.Position.String()), tracing.AttrEvents.Int(events),
			tracing.AttrStream.String(t.StreamID), tracing.AttrMessagingOperation.String("send"))
	}
	err := pub.Publish(ctx, t)
	tracing.End(span, err)
	return err
}

// coalesce makes one trigger for a batch of events: the last position, every type, and the
// stream when there is only one.
func coalesce(events []eventstore.Event) trigger.Trigger {
	last := events[len(events)-1]
	t := trigger.Trigger{Position: last.Position, StreamID: last.StreamID, At: time.Now().UTC(), Reason: trigger.ReasonAppend}
	keys := map[uint32]struct{}{}
	keyed := "" // the stream whose key was added last: a batch's events come in runs of a stream
	for i, e := range events {
		if !slices.Contains(t.Types, e.Type) {
			t.Types = append(t.Types, e.Type)
		}
		if e.StreamID != t.StreamID {
			t.StreamID = ""
		}
		if len(keys) <= trigger.MaxKeys && (i == 0 || e.StreamID != keyed) {
			keys[eventstore.PartitionKey(e.StreamID)] = struct{}{}
			keyed = e.StreamID
		}
	}
	slices.Sort(t.Types)
	if len(keys) <= trigger.MaxKeys { // more: any stream
		t.Keys = slices.Sorted(maps.Keys(keys))
	}
	return t
}

// Run registers the relay and publishes until ctx ends; then it returns nil. A Run while another
// has not returned yet fails with an error matching projection.ErrAlreadyRunning; after it has,
// Run starts again.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("relay %s: %w", r.name, projection.ErrAlreadyRunning)
	}
	defer r.running.Store(false)
	if err := r.runner.Init(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("relay: %w", err)
	}
	return r.poller.Run(ctx)
}

// Wake makes the relay look for new events now; an appender in the same process calls it
// after a commit to cut the latency to a round trip. It never blocks.
func (r *Relay) Wake() { r.poller.Wake() }

// Status returns the relay's status: its position and lag behind the store.
func (r *Relay) Status(ctx context.Context) (projection.Status, error) {
	st, err := r.runner.Status(ctx, r.name)
	if errors.Is(err, projection.ErrNotRegistered) {
		return st, fmt.Errorf("relay %s has not run yet: %w", r.name, err)
	}
	return st, err
}
