package eventstore

import (
	"cmp"
	"errors"
	"fmt"
)

// Defaults for Limits.
const (
	// MaxEventBytesDefault bounds one event's payload and metadata together: 1 MiB. An event
	// records that something happened; a document, an image or a file belongs in a blob store,
	// with a reference in the event. Every projection reads each event again at every rebuild.
	MaxEventBytesDefault = 1 << 20
	// MaxAppendBytesDefault bounds the payloads and metadata of one append together: 16 MiB.
	// PostgreSQL holds the append's transaction, and with it every reader of the store (see
	// eventstore/postgres), while it receives and writes them.
	MaxAppendBytesDefault = 16 << 20
	// MaxAppendEventsDefault bounds the events of one append: 10,000, the most one Read returns
	// (ReadLimitMax).
	MaxAppendEventsDefault = 10_000
)

// Limits bound what one append may carry. A store refuses an append beyond them with a
// *TooLargeError (errors.Is(err, ErrTooLarge)) before it sends anything to the database, so an
// oversized append costs neither a round trip nor a transaction that holds readers back.
// Sizes are the bytes of Payload and Metadata as given. The zero value means every default.
type Limits struct {
	// MaxEventBytes is the most bytes one event's Payload and Metadata may hold together.
	// Defaults to MaxEventBytesDefault.
	MaxEventBytes int
	// MaxAppendBytes is the most bytes the payloads and metadata of one append may hold
	// together. Defaults to MaxAppendBytesDefault; at least MaxEventBytes.
	MaxAppendBytes int
	// MaxAppendEvents is the most events one append may carry. Defaults to
	// MaxAppendEventsDefault.
	MaxAppendEvents int
}

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	l.MaxEventBytes = cmp.Or(l.MaxEventBytes, MaxEventBytesDefault)
	l.MaxAppendBytes = cmp.Or(l.MaxAppendBytes, max(MaxAppendBytesDefault, l.MaxEventBytes))
	l.MaxAppendEvents = cmp.Or(l.MaxAppendEvents, MaxAppendEventsDefault)
	return l
}

// Validate reports every field of l that cannot work, as *ValidationError values (matching
// ErrInvalidInput) joined with errors.Join; nil if l is usable. It checks l as it is: call it on
// l.WithDefaults() unless every field is set.
func (l Limits) Validate() error {
	var errs []error
	bad := func(field, reason string) {
		errs = append(errs, &ValidationError{Field: "Limits." + field, Index: -1, Reason: reason})
	}
	for _, f := range []struct {
		name  string
		value int
		def   int
	}{
		{"MaxEventBytes", l.MaxEventBytes, MaxEventBytesDefault},
		{"MaxAppendBytes", l.MaxAppendBytes, MaxAppendBytesDefault},
		{"MaxAppendEvents", l.MaxAppendEvents, MaxAppendEventsDefault},
	} {
		if f.value < 1 {
			bad(f.name, fmt.Sprintf("%d; it must be at least 1 (0 means %d)", f.value, f.def))
		}
	}
	if l.MaxEventBytes > 0 && l.MaxAppendBytes > 0 && l.MaxAppendBytes < l.MaxEventBytes {
		bad("MaxAppendBytes", fmt.Sprintf("%d is below MaxEventBytes (%d), so an event of that size could never be appended; raise it or lower MaxEventBytes",
			l.MaxAppendBytes, l.MaxEventBytes))
	}
	return errors.Join(errs...)
}

// Names of the Limits fields, for TooLargeError.Limit.
const (
	LimitEventBytes   = "MaxEventBytes"
	LimitAppendBytes  = "MaxAppendBytes"
	LimitAppendEvents = "MaxAppendEvents"
)

// TooLargeError reports an append beyond the store's Limits. Nothing was written. It matches
// ErrTooLarge and ErrInvalidInput.
type TooLargeError struct {
	// Limit names the Limits field the append exceeds: LimitEventBytes, LimitAppendBytes or
	// LimitAppendEvents.
	Limit string
	// Index is the place in the append of the event above MaxEventBytes, or -1 when the append
	// as a whole is too large.
	Index int
	// Size is the event's bytes of payload and metadata (MaxEventBytes), the append's in all
	// (MaxAppendBytes) or its number of events (MaxAppendEvents).
	Size int
	// Max is the limit's value.
	Max int
}

func (e *TooLargeError) Error() string {
	switch e.Limit {
	case LimitEventBytes:
		return fmt.Sprintf("eventstore: append too large: events[%d] holds %s of payload and metadata, above the limit of %s (Limits.%s); nothing was written. "+
			"Keep large content elsewhere (a blob store, say) and put a reference in the event, or raise the store's Config.Limits.%s",
			e.Index, byteCount(e.Size), byteCount(e.Max), e.Limit, e.Limit)
	case LimitAppendBytes:
		return fmt.Sprintf("eventstore: append too large: its events hold %s of payloads and metadata in all, above the limit of %s (Limits.%s); nothing was written. "+
			"Append fewer events at a time (each append is atomic on its own), or raise the store's Config.Limits.%s",
			byteCount(e.Size), byteCount(e.Max), e.Limit, e.Limit)
	default:
		return fmt.Sprintf("eventstore: append too large: %d events, above the limit of %d (Limits.%s); nothing was written. "+
			"Append fewer events at a time (each append is atomic on its own), or raise the store's Config.Limits.%s",
			e.Size, e.Max, e.Limit, e.Limit)
	}
}

// Is makes errors.Is(err, ErrTooLarge) and errors.Is(err, ErrInvalidInput) true.
func (e *TooLargeError) Is(target error) bool {
	return target == ErrTooLarge || target == ErrInvalidInput
}

// byteCount writes n bytes for a person: "1572864 bytes (1.5 MiB)".
func byteCount(n int) string {
	const unit = 1 << 10
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	value, prefix := float64(n)/unit, "KMGT"
	i := 0
	for ; value >= unit && i < len(prefix)-1; i++ {
		value /= unit
	}
	return fmt.Sprintf("%d bytes (%.1f %ciB)", n, value, prefix[i])
}
