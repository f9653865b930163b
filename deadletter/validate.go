package deadletter

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/projection"
)

// This file holds the checks and normalisations every Store backend applies, so that backends
// agree on what they accept and on what they return.

// FoldKey returns the key entries fold by within a projection: the failing event's id, or for
// an invalid trigger (no FailingEvent) "message:" followed by the message UUID.
func FoldKey(e Entry) string {
	if e.FailingEvent != nil {
		return e.FailingEvent.ID.String()
	}
	return "message:" + CleanText(e.MessageUUID)
}

// NormalizeEntry checks e and returns it as it is stored: Attempts defaults to 1 and At to now,
// At is cut to microseconds in UTC, text is cleaned (CleanText) and Error is cut to
// ErrorMaxBytes. Payload and Metadata are copied (nil when empty), and so is FailingEvent.
// Errors match ErrInvalidInput.
func NormalizeEntry(e Entry, now time.Time) (Entry, error) {
	if err := projection.ValidateName(e.Projection); err != nil {
		return Entry{}, fmt.Errorf("%w: Entry.Projection: %w", ErrInvalidInput, err)
	}
	if e.FailingEvent != nil && e.FailingEvent.ID == uuid.Nil {
		return Entry{}, fmt.Errorf("%w: Entry.FailingEvent.ID is empty: set it to the id of the event the projection failed on, or leave FailingEvent nil when the trigger itself was invalid", ErrInvalidInput)
	}
	if e.Attempts < 0 {
		return Entry{}, fmt.Errorf("%w: Entry.Attempts is %d: pass how often the delivery was tried (0 means 1)", ErrInvalidInput, e.Attempts)
	}
	e.Attempts = max(e.Attempts, 1)
	if e.At.IsZero() {
		e.At = now
	}
	e.At = Timestamp(e.At)
	e.MessageUUID = CleanText(e.MessageUUID)
	e.Error = cut(CleanText(e.Error), ErrorMaxBytes)
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
			md[CleanText(k)] = CleanText(v)
		}
		e.Metadata = md
	}
	if e.FailingEvent != nil {
		fe := *e.FailingEvent
		fe.Type = CleanText(fe.Type)
		e.FailingEvent = &fe
	}
	return e, nil
}

// NormalizeFilter checks f and returns it with its default limit filled in. Errors match
// ErrInvalidFilter.
func NormalizeFilter(f Filter) (Filter, error) {
	if f.Projection != "" {
		if err := projection.ValidateName(f.Projection); err != nil {
			return Filter{}, fmt.Errorf("%w: Filter.Projection: %w", ErrInvalidFilter, err)
		}
	}
	switch {
	case f.Limit == 0:
		f.Limit = ListLimitDefault
	case f.Limit < 0 || f.Limit > ListLimitMax:
		return Filter{}, fmt.Errorf("%w: Filter.Limit %d is out of range: use 1 to %d (0 means %d) and page with AfterID",
			ErrInvalidFilter, f.Limit, ListLimitMax, ListLimitDefault)
	}
	if f.AfterID < 0 {
		return Filter{}, fmt.Errorf("%w: Filter.AfterID %d is negative: use 0 for the first page, then the last ID of the previous page", ErrInvalidFilter, f.AfterID)
	}
	for _, st := range f.Status {
		if _, err := ParseStatus(string(st)); err != nil {
			return Filter{}, fmt.Errorf("%w: Filter.Status: %w", ErrInvalidFilter, err)
		}
	}
	if len(f.Status) > 0 {
		f.Status = slices.Clone(f.Status)
	}
	return f, nil
}

// Matches reports whether a record is selected by f's projection and statuses (not by its
// paging fields).
func (f Filter) Matches(r Record) bool {
	return (f.Projection == "" || f.Projection == r.Projection) &&
		(len(f.Status) == 0 || slices.Contains(f.Status, r.Status))
}

// NormalizeActor checks the name of who replays or resolves (field names the argument in the
// error) and returns it cleaned. Errors match ErrInvalidInput.
func NormalizeActor(field, by string) (string, error) {
	by = strings.TrimSpace(CleanText(by))
	if by == "" {
		return "", fmt.Errorf("%w: %s is empty: say who acts, e.g. an operator's name or \"worker-start\"; it is kept on the record", ErrInvalidInput, field)
	}
	return by, nil
}

// NormalizePurge checks opts and returns them with Now defaulted to now and cut to
// microseconds. Errors match ErrInvalidFilter.
func NormalizePurge(opts PurgeOptions, now time.Time) (PurgeOptions, error) {
	if opts.OlderThan < 0 {
		return PurgeOptions{}, fmt.Errorf("%w: PurgeOptions.OlderThan %s is negative: pass the age below which records are kept, e.g. 720h for 30 days", ErrInvalidFilter, opts.OlderThan)
	}
	if opts.Now.IsZero() {
		opts.Now = now
	}
	opts.Now = Timestamp(opts.Now)
	return opts, nil
}

// Cutoff is the LastFailedAt before which opts selects records.
func (opts PurgeOptions) Cutoff() time.Time { return opts.Now.Add(-opts.OlderThan) }

// Timestamp returns t as stores keep it: in UTC, cut to microseconds (PostgreSQL's precision),
// without a monotonic clock reading. The zero time stays zero.
func Timestamp(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}

// CleanText returns s as valid UTF-8 without NUL bytes, which PostgreSQL text and jsonb cannot
// hold: NULs are dropped and invalid bytes become U+FFFD. Dead letters carry text off the
// wire, and a write that fails on it would bring the trigger back forever.
func CleanText(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// cut shortens s to at most n bytes plus "…", on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// CloneRecord returns a deep copy of r: changing one does not change the other.
func CloneRecord(r Record) Record {
	r.Payload = slices.Clone(r.Payload)
	r.Metadata = maps.Clone(r.Metadata)
	if r.FailingEvent != nil {
		fe := *r.FailingEvent
		r.FailingEvent = &fe
	}
	return r
}
