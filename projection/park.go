package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// OnFailure says what a projection does once a handler keeps failing on an event.
type OnFailure string

const (
	// OnFailureStop stops the whole projection right before the event (state failing) until a
	// fix, a replay or a skip: every other stream's updates wait too. The default, and the only
	// safe choice for projections that aggregate across streams (totals, counters).
	OnFailureStop OnFailure = "stop"
	// OnFailurePark parks the event's stream: the projection records the stream as parked and
	// moves past the event, and later events of that stream are held (counted on the parked
	// record, not handed to the handlers) until a redrive applies them all, in order. Every
	// other stream goes on. It suits projections whose rows depend on one stream each.
	OnFailurePark OnFailure = "park"
)

// OnFailures lists every OnFailure value.
func OnFailures() []OnFailure { return []OnFailure{OnFailureStop, OnFailurePark} }

// Defaults for parking (Config.OnFailure = OnFailurePark).
const (
	// MaxParkedStreamsDefault is how many streams one projection may have parked at once.
	// Past it the projection stops on the next failing event, as with OnFailureStop: a bug that
	// breaks every stream must stop the projection rather than park them all.
	MaxParkedStreamsDefault = 100
	// ParkAfterAttemptsDefault is how many recorded failures on one event park its stream. It
	// equals the worker's default retry budget (retry.MaxAttemptsDefault), so a stream parks on
	// the trigger's last retry instead of the trigger being dead-lettered.
	ParkAfterAttemptsDefault = 5
)

// ParkedStream is a stream a projection parked: its first parked event failed, and its later
// events are held by reference until a redrive.
type ParkedStream struct {
	Projection string
	StreamID   string
	// Event is the first parked event: the one the handler failed on.
	Event eventstore.EventRef
	// StreamVersion is Event's version in its stream.
	StreamVersion int64
	// Error is the handler's error on Event, or of the last failed redrive.
	Error string
	// Attempts counts the failures on Event: those before the park and the failed redrives.
	Attempts int
	// ParkedAt is when the stream was parked.
	ParkedAt time.Time
	// Held counts the later events of the stream the projection passed without handling them.
	Held int64
	// LastHeld is the position of the last of them; zero when none.
	LastHeld eventstore.Position
}

// ParkAction is an operator's (or a worker's) action on a parked stream, recorded for audit.
type ParkAction string

const (
	// ParkActionRedrive: the parked events were applied in order and the stream unparked.
	ParkActionRedrive ParkAction = "redrive"
	// ParkActionSkip: one stream was unparked without applying its parked events; its later
	// events are handled as they come.
	ParkActionSkip ParkAction = "skip"
	// ParkActionPurge: every parked stream of a projection was unparked without applying its
	// parked events.
	ParkActionPurge ParkAction = "purge"
)

// ParkActions lists every ParkAction value.
func ParkActions() []ParkAction {
	return []ParkAction{ParkActionRedrive, ParkActionSkip, ParkActionPurge}
}

// Unpark is a parked stream a unit removes, with the recorded action.
type Unpark struct {
	Stream ParkedStream
	Action ParkAction
	By     string
	Reason string
	At     time.Time
}

// Held is what a batch passed of one parked stream without handling it.
type Held struct {
	Events int64
	Last   eventstore.Position
}

// ParkFailure is a failed redrive of a parked stream, to record on it.
type ParkFailure struct {
	StreamID string
	Err      error
	At       time.Time
}

// ErrNotParked is returned for a redrive, skip or show of a stream that is not parked.
var ErrNotParked = errors.New("projection: stream not parked")

// ParkOptions says who unparks a stream without a redrive, and why. Both are required.
type ParkOptions struct {
	By     string
	Reason string
}

// errNoPark rolls back a park unit that found the failure no longer parkable (another worker
// handled the event, the projection was paused, not enough attempts yet).
var errNoPark = errors.New("projection: failure not parked")

// errParkLimit rolls back a park unit of a projection that has MaxParkedStreams parked.
var errParkLimit = errors.New("projection: too many parked streams")

// IsOutage reports an error that says a connection, not the event, is at fault: a network
// error, a dropped or refused connection, a timeout, PostgreSQL's connection-exception (08),
// shutdown (57P01–57P03) and too-many-connections (53300) errors — also when a handler's own
// I/O (a pool of its own, a remote service) returned it. Such a failure never parks a stream
// and is never dead-lettered: the outage passes, and the event with it.
func IsOutage(err error) bool {
	var (
		netErr net.Error
		pgErr  *pgconn.PgError
	)
	switch {
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || slices.Contains([]string{"57P01", "57P02", "57P03", "53300"}, pgErr.Code)
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}

// permanent reports an error marked retry.Permanent (through its Permanent method, so that this
// package does not import the retry middleware) or a payload that can never decode.
func permanent(err error) bool {
	var p interface{ Permanent() bool }
	return (errors.As(err, &p) && p.Permanent()) || errors.Is(err, ErrDecode)
}

// park parks the failing event's stream, after its failure was recorded, when the projection
// parks on failure and the failure is due: a permanent error or a crash-loop verdict at once,
// any other error once its recorded attempts reach Config.ParkAfterAttempts. It reports
// whether it parked; the catch-up then goes on past the event.
func (b *batch) park(ctx context.Context, res *Result) bool {
	if b.p.cfg.OnFailure != OnFailurePark || b.unattributed {
		return false
	}
	var parked ParkedStream
	err := b.r.backend.RunBatch(ctx, b.p, nil, func(ctx context.Context, u Unit) (Outcome, error) {
		out, ps, err := b.parkUnit(ctx, u)
		parked = ps
		return out, err
	})
	log := b.r.logger.With(slog.String("projection", b.p.name))
	switch {
	case errors.Is(err, errNoPark):
		return false
	case errors.Is(err, errParkLimit):
		log.ErrorContext(ctx, "projection: too many parked streams; the projection stops on the event instead",
			slog.Int("max_parked_streams", b.p.cfg.MaxParkedStreams), slog.String("stream_id", b.failed.Event.StreamID))
		return false
	case err != nil:
		log.ErrorContext(ctx, "projection: could not park the failing event's stream", slog.Any("error", err))
		return false
	}
	res.Position = parked.Event.Position
	b.r.remember(b.p.name, parked.Event.Position, false)
	log.WarnContext(ctx, "projection parked a stream; its later events wait for a redrive",
		slog.String("stream_id", parked.StreamID), slog.String("event_id", parked.Event.ID.String()),
		slog.String("event_type", parked.Event.Type), slog.String("position", parked.Event.Position.String()),
		slog.Int("attempts", parked.Attempts), slog.String("error", parked.Error))
	return true
}

// parkUnit is the park's unit of work: it parks the failing event's stream and moves the
// position past the event, if the event is still the next to handle and the failure is due.
func (b *batch) parkUnit(ctx context.Context, u Unit) (Outcome, ParkedStream, error) {
	st, f := u.Status, b.failed
	if IsOutage(f.Err) {
		return Outcome{}, ParkedStream{}, errNoPark // an outage waits
	}
	due := b.crashLoop || permanent(f.Err) ||
		(st.FailingEvent != nil && st.FailingEvent.ID == f.Event.ID && st.Attempts >= b.p.cfg.ParkAfterAttempts)
	if !due || st.State == StatePaused || !st.Position.Less(f.Event.Position) {
		return Outcome{}, ParkedStream{}, errNoPark
	}
	next, err := u.Read(ctx, st.Position, eventstore.ReadOptions{Limit: 1, Types: b.p.types, OmitPayload: true, Partition: b.p.partition})
	if err != nil {
		return Outcome{}, ParkedStream{}, err
	}
	if len(next) == 0 || next[0].ID != f.Event.ID {
		return Outcome{}, ParkedStream{}, errNoPark // not the next event any more
	}
	if len(u.Parked) >= b.p.cfg.MaxParkedStreams {
		return Outcome{}, ParkedStream{}, errParkLimit
	}
	ps := ParkedStream{
		Projection: b.p.name, StreamID: f.Event.StreamID, Event: f.Event, StreamVersion: next[0].StreamVersion,
		Error: errorText(f.Err), Attempts: max(st.Attempts, 1), ParkedAt: b.r.now(),
	}
	state := st.State
	if state == StateFailing {
		state = StateRunning
	}
	return Outcome{Position: f.Event.Position, State: state, ClearFailure: true, Park: &ps}, ps, nil
}

// errorText is an error as a parked record keeps it.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// holdParked splits off the events of parked streams: they are not handed to the handlers
// but counted on their parked records (held).
func (b *batch) hold(e eventstore.Event) bool {
	if _, ok := b.parked[e.StreamID]; !ok {
		return false
	}
	if b.held == nil {
		b.held = make(map[string]Held)
	}
	h := b.held[e.StreamID]
	h.Events++
	h.Last = e.Position
	b.held[e.StreamID] = h
	return true
}

// Parked returns the projection's parked streams, oldest first (those of every partition of
// a partitioned projection).
func (r *Runner) Parked(ctx context.Context, name string) ([]ParkedStream, error) {
	p, err := r.Projection(name)
	if err != nil {
		return nil, err
	}
	if !p.Partitioned() {
		return r.backend.Parked(ctx, p)
	}
	var all []ParkedStream
	for _, u := range p.parts {
		parked, err := r.backend.Parked(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", u.name, err)
		}
		all = append(all, parked...)
	}
	slices.SortFunc(all, func(a, b ParkedStream) int {
		return cmp.Or(a.Event.Position.Compare(b.Event.Position), strings.Compare(a.StreamID, b.StreamID))
	})
	return all, nil
}

// Redrive applies the parked events of one stream of the projection — the first parked event
// and every later event of the stream up to the projection's position, in version order —
// through the projection's current handlers and flush hook, in one unit of work (one
// transaction) that holds the projection's lock, and unparks the stream in the same unit. A
// live batch of the projection waits for it, so no later event of the stream is handled before
// the parked ones. A failing redrive rolls back and leaves the stream parked with the new error
// (returned as a *HandlerError). It returns the number of events applied. A stream that is
// not parked is an error matching ErrNotParked.
func (r *Runner) Redrive(ctx context.Context, name, streamID, by string) (int, error) {
	ctx, span := r.tracer.Start(ctx, tracing.SpanRedrive, trace.SpanKindInternal)
	n, err := r.redrive(ctx, name, streamID, by)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrProjection.String(name), tracing.AttrStream.String(streamID),
			tracing.AttrBy.String(by), tracing.AttrEvents.Int(n))
	}
	tracing.End(span, err)
	return n, err
}

// redrive is Redrive's work.
func (r *Runner) redrive(ctx context.Context, name, streamID, by string) (int, error) {
	p, err := r.Projection(name)
	if err != nil {
		return 0, err
	}
	p = p.unit(streamID) // the stream's partition
	d := &redrive{r: r, p: p, stream: streamID, by: by}
	err = r.backend.RunBatch(ctx, p, nil, d.unit)
	if d.failed == nil || ctx.Err() != nil {
		if err == nil {
			r.logger.InfoContext(ctx, "projection redrove a parked stream", slog.String("projection", name),
				slog.String("stream_id", streamID), slog.Int("events", d.applied), slog.String("by", by))
		}
		return d.applied, err
	}
	fail := ParkFailure{StreamID: streamID, Err: d.failed.Err, At: r.now()}
	if rerr := r.backend.RunBatch(ctx, p, nil, func(_ context.Context, u Unit) (Outcome, error) {
		return Outcome{Position: u.Status.Position, State: u.Status.State, ParkFailed: &fail}, nil
	}); rerr != nil {
		return 0, errors.Join(err, fmt.Errorf("projection %s: record the failed redrive: %w", name, rerr))
	}
	r.logger.WarnContext(ctx, "projection: redrive of a parked stream failed; it stays parked", slog.String("projection", name),
		slog.String("stream_id", streamID), slog.String("event_id", d.failed.Event.ID.String()), slog.Any("error", d.failed.Err))
	return 0, err
}

// RedriveAll redrives every parked stream of the projection (Redrive), oldest first, and
// returns how many were unparked. A stream whose redrive fails stays parked; the others go on,
// and the failures are returned together.
func (r *Runner) RedriveAll(ctx context.Context, name, by string) (int, error) {
	parked, err := r.Parked(ctx, name)
	if err != nil {
		return 0, err
	}
	var (
		done int
		errs []error
	)
	for _, ps := range parked {
		_, err := r.Redrive(ctx, name, ps.StreamID, by)
		switch {
		case err == nil:
			done++
		case errors.Is(err, ErrNotParked):
			// another worker redrove it meanwhile
		case ctx.Err() != nil:
			return done, err
		default:
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}

// redrive is one Redrive's unit of work.
type redrive struct {
	r       *Runner
	p       *Projection
	stream  string
	by      string
	applied int
	failed  *HandlerError
}

func (d *redrive) unit(ctx context.Context, u Unit) (Outcome, error) {
	ps, ok := u.Parked[d.stream]
	if !ok {
		return Outcome{}, fmt.Errorf("%w: projection %s, stream %q", ErrNotParked, d.p.name, d.stream)
	}
	events, err := d.read(ctx, u, ps)
	if err != nil {
		return Outcome{}, err
	}
	var queue Queue
	for i := range events {
		if err := d.p.handleInBatch(ctx, u.Tx, &queue, events, i); err != nil {
			return Outcome{}, d.fail(err)
		}
	}
	if err := d.p.sendQueue(ctx, u.Tx, &queue, events); err != nil {
		return Outcome{}, d.fail(err)
	}
	if fn := d.p.cfg.FlushFunc; fn != nil && len(events) > 0 {
		if err := fn(ctx, FlushParams{Projection: d.p.name, Tx: u.Tx, Events: events}); err != nil {
			return Outcome{}, d.fail(flushError(d.p, events, err))
		}
	}
	d.applied = len(events)
	return Outcome{
		Position: u.Status.Position, State: u.Status.State, Processed: len(events),
		Unpark: []Unpark{{Stream: ps, Action: ParkActionRedrive, By: d.by, Reason: "redrive", At: d.r.now()}},
	}, nil
}

func (d *redrive) fail(err error) error {
	var he *HandlerError
	if errors.As(err, &he) {
		d.failed = he
	}
	return err
}

// read reads the parked events of ps: from its first parked version up to the projection's
// position, of the projection's types, in version order.
func (d *redrive) read(ctx context.Context, u Unit, ps ParkedStream) ([]eventstore.Event, error) {
	var events []eventstore.Event
	after := ps.StreamVersion - 1
	for {
		page, err := u.ReadStream(ctx, d.stream, after, eventstore.ReadLimitMax)
		if err != nil {
			return nil, fmt.Errorf("projection %s: read parked stream %q: %w", d.p.name, d.stream, err)
		}
		for _, e := range page {
			if u.Status.Position.Less(e.Position) {
				return events, nil // handled live once unparked
			}
			if d.p.types == nil || slices.Contains(d.p.types, e.Type) {
				events = append(events, e)
			}
		}
		if len(page) < eventstore.ReadLimitMax {
			return events, nil
		}
		after = page[len(page)-1].StreamVersion
	}
}

// SkipParked unparks one stream without applying its parked events: they are never handled
// (the read model misses them), and the stream's later events are handled as they come. An
// explicit operator action, recorded with who, when and why.
func (r *Runner) SkipParked(ctx context.Context, name, streamID string, opts ParkOptions) error {
	return r.unpark(ctx, name, streamID, ParkActionSkip, opts)
}

// PurgeParked unparks every parked stream of the projection without applying their parked
// events, as SkipParked does for one, and records the action for each.
func (r *Runner) PurgeParked(ctx context.Context, name string, opts ParkOptions) error {
	return r.unpark(ctx, name, "", ParkActionPurge, opts)
}

// unpark removes the parked record of streamID ("" for every stream) in a unit of work.
func (r *Runner) unpark(ctx context.Context, name, streamID string, action ParkAction, opts ParkOptions) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if strings.TrimSpace(opts.By) == "" || strings.TrimSpace(opts.Reason) == "" {
		return fmt.Errorf("%w: projection %s: a %s of parked streams needs who does it and a reason", ErrInvalidConfig, name, action)
	}
	if streamID != "" {
		return r.unparkIn(ctx, p.unit(streamID), streamID, action, opts)
	}
	for _, u := range p.Units() {
		if err := r.unparkIn(ctx, u, "", action, opts); err != nil {
			return err
		}
	}
	return nil
}

// unparkIn is unpark in the unit p.
func (r *Runner) unparkIn(ctx context.Context, p *Projection, streamID string, action ParkAction, opts ParkOptions) error {
	name := p.name
	return r.backend.RunBatch(ctx, p, nil, func(_ context.Context, u Unit) (Outcome, error) {
		out := Outcome{Position: u.Status.Position, State: u.Status.State}
		for id, ps := range u.Parked {
			if streamID == "" || id == streamID {
				out.Unpark = append(out.Unpark, Unpark{Stream: ps, Action: action, By: opts.By, Reason: opts.Reason, At: r.now()})
			}
		}
		if streamID != "" && len(out.Unpark) == 0 {
			return Outcome{}, fmt.Errorf("%w: projection %s, stream %q", ErrNotParked, name, streamID)
		}
		return out, nil
	})
}

// flushError charges a flush hook's error to an event: the one it names (the flush returned a
// *HandlerError, e.g. from FlushFailedOn), else the batch's first, marked unattributed.
func flushError(p *Projection, events []eventstore.Event, err error) *HandlerError {
	var he *HandlerError
	if errors.As(err, &he) && slices.ContainsFunc(events, func(e eventstore.Event) bool { return e.ID == he.Event.ID }) {
		return &HandlerError{Projection: p.name, Event: he.Event, Err: fmt.Errorf("flush hook: %w", he.Err)}
	}
	return &HandlerError{Projection: p.name, Event: events[0].Ref(), Err: fmt.Errorf("flush hook: %w", err), unattributed: true}
}

// FlushFailedOn is the error a flush hook (Config.FlushFunc) returns to say which of the
// batch's events its failure belongs to. With OnFailurePark, that event's stream can then be
// parked; a flush error that names no event stops the projection, as with OnFailureStop.
func FlushFailedOn(e eventstore.Event, err error) error {
	return &HandlerError{Event: e.Ref(), Err: err}
}
