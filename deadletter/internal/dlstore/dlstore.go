// Package dlstore holds the checks and normalisations every deadletter.Store backend applies,
// so that deadletter/postgres and deadletter/memory agree on what they accept and on what they
// return. Users never call it: the stores do.
package dlstore

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/internal/clean"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/name"
)

// FoldKey returns the key entries fold by within a projection: the failing event's id, or for
// an invalid trigger (no FailingEvent) "message:" followed by the message UUID.
func FoldKey(e deadletter.Entry) string {
	if e.FailingEvent != nil {
		return e.FailingEvent.ID.String()
	}
	return "message:" + clean.Text(e.MessageUUID)
}

// NormalizePassed checks the projection name of a ResolvePassed call. Errors match
// deadletter.ErrInvalidInput.
func NormalizePassed(projection string) error {
	if err := name.Validate(projection); err != nil {
		return fmt.Errorf("%w: ResolvePassed's projection: %w", deadletter.ErrInvalidInput, err)
	}
	return nil
}

// HealedNote is the ResolveNote of a record Store.ResolvePassed resolves at at, its projection
// having committed position passed.
func HealedNote(passed eventstore.Position, at time.Time) string {
	return "healed: projection passed position " + passed.String() + " at " + at.UTC().Format(time.RFC3339Nano)
}

// NormalizeEntry checks e and returns it as it is stored: Attempts defaults to 1 and At to now,
// At is cut to microseconds in UTC, text is cleaned (clean.Text) and Error is cut to
// deadletter.ErrorMaxBytes. Payload and Metadata are copied (nil when empty), and so is
// FailingEvent. Errors match deadletter.ErrInvalidInput.
func NormalizeEntry(e deadletter.Entry, now time.Time) (deadletter.Entry, error) {
	if err := name.Validate(e.Projection); err != nil {
		return deadletter.Entry{}, fmt.Errorf("%w: Entry.Projection: %w", deadletter.ErrInvalidInput, err)
	}
	if e.FailingEvent != nil && e.FailingEvent.ID == uuid.Nil {
		return deadletter.Entry{}, fmt.Errorf("%w: Entry.FailingEvent.ID is empty: set it to the id of the event the projection failed on, or leave FailingEvent nil when the trigger itself was invalid", deadletter.ErrInvalidInput)
	}
	if e.Attempts < 0 {
		return deadletter.Entry{}, fmt.Errorf("%w: Entry.Attempts is %d: pass how often the delivery was tried (0 means 1)", deadletter.ErrInvalidInput, e.Attempts)
	}
	e.Attempts = max(e.Attempts, 1)
	if e.At.IsZero() {
		e.At = now
	}
	e.At = clean.Time(e.At)
	e.MessageUUID = clean.Text(e.MessageUUID)
	e.Error = cut(clean.Text(e.Error), deadletter.ErrorMaxBytes)
	if len(e.Payload) == 0 {
		e.Payload = nil
	} else {
		e.Payload = slices.Clone(e.Payload)
	}
	if len(e.Metadata) == 0 {
		e.Metadata = nil
	} else {
		md := make(map[string]string, len(e.Metadata))
		for k, v := range e.Metadata {
			md[clean.Text(k)] = clean.Text(v)
		}
		e.Metadata = md
	}
	if e.FailingEvent != nil {
		fe := *e.FailingEvent
		fe.Type, fe.StreamID = clean.Text(fe.Type), clean.Text(fe.StreamID)
		e.FailingEvent = &fe
	}
	return e, nil
}

// NormalizeFilter checks f and returns it with its default limit filled in. Errors match
// deadletter.ErrInvalidFilter.
func NormalizeFilter(f deadletter.Filter) (deadletter.Filter, error) {
	if f.Projection != "" {
		if err := name.Validate(f.Projection); err != nil {
			return deadletter.Filter{}, fmt.Errorf("%w: Filter.Projection: %w", deadletter.ErrInvalidFilter, err)
		}
	}
	switch {
	case f.Limit == 0:
		f.Limit = deadletter.ListLimitDefault
	case f.Limit < 0 || f.Limit > deadletter.ListLimitMax:
		return deadletter.Filter{}, fmt.Errorf("%w: Filter.Limit %d is out of range: use 1 to %d (0 means %d) and page with AfterID",
			deadletter.ErrInvalidFilter, f.Limit, deadletter.ListLimitMax, deadletter.ListLimitDefault)
	}
	if f.AfterID < 0 {
		return deadletter.Filter{}, fmt.Errorf("%w: Filter.AfterID %d is negative: use 0 for the first page, then the last ID of the previous page", deadletter.ErrInvalidFilter, f.AfterID)
	}
	for _, st := range f.Status {
		if _, err := deadletter.ParseStatus(string(st)); err != nil {
			return deadletter.Filter{}, fmt.Errorf("%w: Filter.Status: %w", deadletter.ErrInvalidFilter, err)
		}
	}
	if len(f.Status) > 0 {
		f.Status = slices.Clone(f.Status)
	}
	return f, nil
}

// Matches reports whether f's projection and statuses (not its paging fields) select r.
func Matches(f deadletter.Filter, r deadletter.Record) bool {
	return (f.Projection == "" || f.Projection == r.Projection || IsPartitionOf(r.Projection, f.Projection)) &&
		(len(f.Status) == 0 || slices.Contains(f.Status, r.Status))
}

// IsPartitionOf reports whether unit is the unit name of a partition of projection:
// projection + ".p" + digits (projection.PartitionUnitName).
func IsPartitionOf(unit, projection string) bool {
	digits, ok := strings.CutPrefix(unit, projection+".p")
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// NormalizeActor checks the name of who replays or resolves (field names the argument in the
// error) and returns it cleaned. Errors match deadletter.ErrInvalidInput.
func NormalizeActor(field, by string) (string, error) {
	by, err := clean.Actor(field, by)
	if err != nil {
		return "", fmt.Errorf("%w: %w", deadletter.ErrInvalidInput, err)
	}
	return by, nil
}

// NormalizePurge checks opts and returns them with Now defaulted to now and cut to
// microseconds. Errors match deadletter.ErrInvalidFilter.
func NormalizePurge(opts deadletter.PurgeOptions, now time.Time) (deadletter.PurgeOptions, error) {
	if opts.OlderThan < 0 {
		return deadletter.PurgeOptions{}, fmt.Errorf("%w: PurgeOptions.OlderThan %s is negative: pass the age below which records are kept, e.g. 720h for 30 days", deadletter.ErrInvalidFilter, opts.OlderThan)
	}
	if opts.Now.IsZero() {
		opts.Now = now
	}
	opts.Now = clean.Time(opts.Now)
	return opts, nil
}

// Cutoff is the LastFailedAt before which opts selects records.
func Cutoff(opts deadletter.PurgeOptions) time.Time { return opts.Now.Add(-opts.OlderThan) }

// cut shortens s to at most n bytes plus "…", on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// CloneRecord returns a deep copy of r: changing one does not change the other.
func CloneRecord(r deadletter.Record) deadletter.Record {
	r.Payload = slices.Clone(r.Payload)
	r.Metadata = maps.Clone(r.Metadata)
	if r.FailingEvent != nil {
		fe := *r.FailingEvent
		r.FailingEvent = &fe
	}
	return r
}
