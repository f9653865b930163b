package deadletter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/deadletter/internal/clean"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/trigger"
)

// ReplayFilter selects the records Replay replays. Set exactly one of IDs, Projection and All.
type ReplayFilter struct {
	// IDs replays these records. Unknown IDs fail the replay before anything changes; resolved
	// records are skipped.
	IDs []int64
	// Projection replays every failed or replayed record of this projection.
	Projection string
	// All replays every failed or replayed record of every projection.
	All bool
	// FailedBefore, when set, leaves alone the records of Projection or All whose
	// LastFailedAt is not before it: a worker's replay at start replays what failed before
	// the worker was made, not what its own first triggers dead-lettered meanwhile.
	FailedBefore time.Time
	// PageSize is how many records Replay reads and marks at a time, which bounds its memory
	// and the size of its statements. Defaults to ReplayPageSizeDefault; at most ListLimitMax.
	PageSize int
}

// selects reports whether a listed record passes f.FailedBefore.
func (f ReplayFilter) selects(rec Record) bool {
	return f.FailedBefore.IsZero() || rec.LastFailedAt.Before(f.FailedBefore)
}

// ReplayResult says what a Replay did.
type ReplayResult struct {
	// Replayed is how many records were marked replayed.
	Replayed int
	// Skipped is how many records named in ReplayFilter.IDs were left alone because they are
	// resolved.
	Skipped int
	// Projections are the projections a replay trigger was published to, sorted.
	Projections []string
}

// Replay republishes the records f selects: each record in status failed or replayed is marked
// replayed (by, now), then one trigger addressed to its projection only
// (trigger.Trigger{Projection: …, Reason: trigger.ReasonReplay, At: now}) is published per
// projection, however many of its records were selected. The projection then catches up from
// its own position by itself, as after any trigger.
//
// Replay reads and marks records a page at a time (ReplayFilter.PageSize) and remembers only
// the names of the projections to trigger, so replaying everything is bounded. Running it
// again publishes again and counts another replay; nothing else changes, and a trigger to a
// projection with nothing left to do costs one empty read. A projection none of whose records
// is failed or replayed gets no trigger.
//
// Records are marked before the triggers go out: a projection that fails again at once on the
// replay trigger then dead-letters into the record after the mark, which sets it back to
// failed, rather than having its new failure overwritten by a late mark. If a publish fails,
// Replay returns the error and the result so far; the records are already marked, so run the
// replay again (replayed records are replayed again).
//
// now defaults to the time of the call. An empty filter is refused with an error matching
// ErrInvalidFilter, so nothing is replayed by accident.
//
// Replay runs in a span (nudge.deadletter.replay, a child of ctx's span) of the global
// TracerProvider, or of WithTracerProvider's: the replayed triggers carry its trace context, so
// their trigger spans, and the batches they start, continue its trace. With no provider set it
// costs nothing.
func Replay(ctx context.Context, store Store, pub trigger.Publisher, f ReplayFilter, by string, now time.Time, opts ...ReplayOption) (ReplayResult, error) {
	var o replayOptions
	for _, opt := range opts {
		opt(&o)
	}
	ctx, span := tracing.New(o.tracerProvider).Start(ctx, tracing.SpanReplay, trace.SpanKindProducer)
	res, err := replay(ctx, store, pub, f, by, now)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrBy.String(by), tracing.AttrCount.Int(res.Replayed), tracing.AttrProjections.StringSlice(res.Projections))
		if f.Projection != "" {
			span.SetAttributes(tracing.AttrProjection.String(f.Projection))
		}
	}
	tracing.End(span, err)
	return res, err
}

// ReplayOption configures Replay.
type ReplayOption func(*replayOptions)

type replayOptions struct {
	tracerProvider trace.TracerProvider
}

// WithTracerProvider makes Replay's span come from tp instead of otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) ReplayOption {
	return func(o *replayOptions) { o.tracerProvider = tp }
}

// replay is Replay's work.
func replay(ctx context.Context, store Store, pub trigger.Publisher, f ReplayFilter, by string, now time.Time) (ReplayResult, error) {
	if store == nil || pub == nil {
		return ReplayResult{}, fmt.Errorf("%w: Replay needs a dead-letter store and a trigger publisher (a channel), got nil", ErrInvalidInput)
	}
	if err := validateReplayFilter(&f); err != nil {
		return ReplayResult{}, err
	}
	by, err := clean.Actor("Replay's by", by)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	if now.IsZero() {
		now = time.Now()
	}
	now = clean.Time(now)

	var (
		res     ReplayResult
		targets = map[string]bool{} // projections to trigger
	)
	if len(f.IDs) > 0 {
		err = markIDs(ctx, store, f, by, now, &res, targets)
	} else {
		err = markPages(ctx, store, f, by, now, &res, targets)
	}
	if err != nil {
		return res, err
	}

	names := make([]string, 0, len(targets))
	for name := range targets {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t := trigger.Trigger{Projection: name, Reason: trigger.ReasonReplay, At: now}
		if err := pub.Publish(ctx, t); err != nil {
			return res, fmt.Errorf("deadletter: replay: publish the trigger for projection %s: %w; its records are marked replayed but it was not nudged: run the replay again", name, err)
		}
		res.Projections = append(res.Projections, name)
	}
	return res, nil
}

// ReplayTargets returns the projections a Replay with f would trigger now, sorted, and
// changes nothing: a caller checks that each has a consumer (a declared subscription) before
// it replays, so that no record is marked replayed for a trigger nobody would read. f is
// checked as Replay checks it; an unknown ID fails with an error matching ErrNotFound.
func ReplayTargets(ctx context.Context, store Store, f ReplayFilter) ([]string, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: ReplayTargets needs a dead-letter store, got nil", ErrInvalidInput)
	}
	if err := validateReplayFilter(&f); err != nil {
		return nil, err
	}
	targets := map[string]bool{}
	collect := replayableOfList
	if len(f.IDs) > 0 {
		collect = replayableOfIDs
	}
	if err := collect(ctx, store, f, targets); err != nil {
		return nil, err
	}
	names := slices.Collect(maps.Keys(targets))
	slices.Sort(names)
	return names, nil
}

// replayableOfIDs adds to targets the projection of each record of f.IDs that can be replayed.
func replayableOfIDs(ctx context.Context, store Store, f ReplayFilter, targets map[string]bool) error {
	for _, id := range f.IDs {
		rec, err := store.Get(ctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return err
			}
			return fmt.Errorf("deadletter: read record %d: %w", id, err)
		}
		if rec.Status.Replayable() {
			targets[rec.Projection] = true
		}
	}
	return nil
}

// replayableOfList adds to targets the projection of every replayable record of f.Projection
// (every projection's when it is empty), listed page by page.
func replayableOfList(ctx context.Context, store Store, f ReplayFilter, targets map[string]bool) error {
	filter := Filter{Projection: f.Projection, Status: []Status{StatusFailed, StatusReplayed}, Limit: f.PageSize}
	for {
		page, err := store.List(ctx, filter)
		if err != nil {
			return fmt.Errorf("deadletter: list records after ID %d: %w", filter.AfterID, err)
		}
		for _, rec := range page {
			if f.selects(rec) {
				targets[rec.Projection] = true
			}
		}
		if len(page) < f.PageSize {
			return nil
		}
		filter.AfterID = page[len(page)-1].ID
	}
}

func validateReplayFilter(f *ReplayFilter) error {
	set := 0
	if len(f.IDs) > 0 {
		set++
	}
	if f.Projection != "" {
		set++
		if err := name.Validate(f.Projection); err != nil {
			return fmt.Errorf("%w: ReplayFilter.Projection: %w", ErrInvalidFilter, err)
		}
	}
	if f.All {
		set++
	}
	switch {
	case set == 0:
		return fmt.Errorf("%w: the replay filter is empty: set IDs to replay some records, Projection to replay one projection's, or All to replay every failed record", ErrInvalidFilter)
	case set > 1:
		return fmt.Errorf("%w: the replay filter sets more than one of IDs, Projection and All: set exactly one", ErrInvalidFilter)
	case len(f.IDs) > 0 && !f.FailedBefore.IsZero():
		return fmt.Errorf("%w: ReplayFilter.FailedBefore goes with Projection or All, not IDs (the records named are replayed)", ErrInvalidFilter)
	}
	switch {
	case f.PageSize == 0:
		f.PageSize = ReplayPageSizeDefault
	case f.PageSize < 0 || f.PageSize > ListLimitMax:
		return fmt.Errorf("%w: ReplayFilter.PageSize %d is out of range: use 1 to %d (0 means %d)", ErrInvalidFilter, f.PageSize, ListLimitMax, ReplayPageSizeDefault)
	}
	for _, id := range f.IDs {
		if id <= 0 {
			return fmt.Errorf("%w: ReplayFilter.IDs holds %d: record IDs are positive; take them from List", ErrInvalidFilter, id)
		}
	}
	return nil
}

// markIDs marks the named records. It looks every one up first, so an unknown ID changes
// nothing.
func markIDs(ctx context.Context, store Store, f ReplayFilter, by string, now time.Time, res *ReplayResult, targets map[string]bool) error {
	ids := slices.Clone(f.IDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	eligible := make([]int64, 0, len(ids))
	for _, id := range ids {
		rec, err := store.Get(ctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return fmt.Errorf("%w; nothing was replayed", err)
			}
			return fmt.Errorf("deadletter: replay: read record %d: %w", id, err)
		}
		if !rec.Status.Replayable() {
			res.Skipped++
			continue
		}
		eligible = append(eligible, id)
		targets[rec.Projection] = true
	}
	for chunk := range slices.Chunk(eligible, f.PageSize) {
		n, err := store.MarkReplayed(ctx, chunk, by, now)
		res.Replayed += n
		if err != nil {
			return fmt.Errorf("deadletter: replay: mark records replayed: %w", err)
		}
	}
	return nil
}

// markPages marks the records of f.Projection (or of all projections) a page at a time.
func markPages(ctx context.Context, store Store, f ReplayFilter, by string, now time.Time, res *ReplayResult, targets map[string]bool) error {
	filter := Filter{Projection: f.Projection, Status: []Status{StatusFailed, StatusReplayed}, Limit: f.PageSize}
	ids := make([]int64, 0, f.PageSize)
	for {
		page, err := store.List(ctx, filter)
		if err != nil {
			return fmt.Errorf("deadletter: replay: list records after ID %d: %w", filter.AfterID, err)
		}
		if len(page) == 0 {
			return nil
		}
		ids = ids[:0]
		for _, rec := range page {
			if !f.selects(rec) {
				continue
			}
			ids = append(ids, rec.ID)
			targets[rec.Projection] = true
		}
		if len(ids) > 0 {
			n, err := store.MarkReplayed(ctx, ids, by, now)
			res.Replayed += n
			if err != nil {
				return fmt.Errorf("deadletter: replay: mark records replayed: %w", err)
			}
		}
		if len(page) < f.PageSize {
			return nil
		}
		filter.AfterID = page[len(page)-1].ID
	}
}
