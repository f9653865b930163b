// Package trigger defines nudge's trigger: the small message that tells a projection "something
// happened, go look". A trigger carries no data a projection relies on — the projection reads
// the event store from its own position — so a lost, duplicated, delayed or reordered trigger can
// only delay a projection, never corrupt it.
//
// On the wire a trigger is versioned JSON, well under MaxSize bytes:
//
//	{"v":1,"pos":"7414/1203","stream":"ticket-42","types":["TicketWasRegistered"],"at":"2026-11-22T10:00:00Z","reason":"append"}
//
// Operators' requests are addressed to one projection ("for") and carry what the projection's
// worker needs to act on them with the projection's definition:
//
//	{"v":1,"at":"2026-11-22T10:00:00.123456Z","reason":"rebuild","for":"ticket_list","rebuild":{"by":"ann"}}
//
// A trigger without a reason is a catch-up: Decode reads it as ReasonAppend with whatever
// position it has (none: catch up to the end). So are the reasons "tick" and "startup", which
// older builds defined, so that such triggers still waiting in a durable queue are caught up on
// after an upgrade.
//
// Decode refuses anything else (unknown versions or reasons, malformed JSON, oversized payloads,
// a request without what it needs) with a *DecodeError matching ErrInvalid: such a trigger can
// never succeed, so it is dead-lettered at once rather than retried.
package trigger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
)

// Version is the trigger format this package writes and reads.
const Version = 1

// MaxSize is the largest encoded trigger, in bytes. Encode drops the type list of a trigger that
// would be larger (no list means "any type").
const MaxSize = 1024

// Reason says why a trigger was sent.
type Reason string

const (
	// ReasonAppend: events were appended (up to Trigger.Position), or, without a position,
	// "catch up": a trigger without a reason decodes as this one.
	ReasonAppend Reason = "append"
	// ReasonReplay: an operator replayed a dead letter.
	ReasonReplay Reason = "replay"
	// ReasonSkip: an operator asks the projection's worker to skip one event (Trigger.Skip), so
	// that the skip runs with the projection's definition and its on-skip hook.
	ReasonSkip Reason = "skip"
	// ReasonRebuild: an operator asks the projection's worker to rebuild it (Trigger.Rebuild):
	// run its reset hook and set its position back to the start (projection.Runner.Reset), then
	// catch up. Only the worker has the projection's definition, and so its reset hook. The
	// trigger must name the Projection and carry At, the time of the request: a worker resets
	// only if the projection's last rebuild started before At, so a redelivered trigger does not
	// start the same rebuild again. At and the projection's RebuildStartedAt (stamped by the
	// database) must come from the same clock: take At from the database (SELECT
	// clock_timestamp()), as the operator CLI does, or from a clock kept in sync with it.
	ReasonRebuild Reason = "rebuild"
	// ReasonRedrive: an operator asks the projection's worker to redrive parked streams
	// (Trigger.Redrive): apply their parked events through the projection's current handlers
	// (projection.Runner.Redrive), which only the worker has. The trigger must name the
	// Projection.
	ReasonRedrive Reason = "redrive"
)

// Reasons returns every reason, in the order they are declared.
func Reasons() []Reason {
	return []Reason{ReasonAppend, ReasonReplay, ReasonSkip, ReasonRebuild, ReasonRedrive}
}

// reason returns the reason a wire trigger's reason stands for, and false if it is none: no
// reason, and the retired catch-up reasons of older builds, mean ReasonAppend.
func reason(r Reason) (Reason, bool) {
	switch r {
	case "", "tick", "startup":
		return ReasonAppend, true
	case ReasonAppend, ReasonReplay, ReasonSkip, ReasonRebuild, ReasonRedrive:
		return r, true
	}
	return "", false
}

// RebuildRequest is an operator's request, carried by a ReasonRebuild trigger, to rebuild a
// projection.
type RebuildRequest struct {
	// By names who asked, for the worker's logs.
	By string `json:"by"`
}

// SkipRequest is an operator's request, carried by a ReasonSkip trigger, to skip one event.
type SkipRequest struct {
	EventID uuid.UUID `json:"event"`
	Reason  string    `json:"reason"`
	By      string    `json:"by"`
	Force   bool      `json:"force,omitempty"`
}

// RedriveRequest is an operator's request, carried by a ReasonRedrive trigger, to redrive the
// projection's parked streams.
type RedriveRequest struct {
	// Stream is the one stream to redrive; empty for every parked stream of the projection.
	Stream string `json:"stream,omitempty"`
	// By names who asked; it is recorded with the redrive.
	By string `json:"by"`
}

// Trigger is a nudge to catch up.
type Trigger struct {
	// Position is the position appended up to; zero when the trigger is not about an append.
	Position eventstore.Position
	// StreamID is the stream appended to, if one.
	StreamID string
	// Types are the event types appended; empty means any type.
	Types []string
	// Keys are the partition keys (eventstore.PartitionKey) of the streams appended to,
	// distinct; empty means any stream. A partition of a partitioned projection that none of
	// them falls in has nothing to do for the trigger (ConcernsPartition).
	Keys []uint32
	// At is when the trigger was made.
	At time.Time
	// Reason says why.
	Reason Reason
	// Projection, when set, addresses one projection only; others ignore the trigger.
	Projection string
	// Skip is set on ReasonSkip triggers, which must also name the Projection.
	Skip *SkipRequest
	// Rebuild may be set on ReasonRebuild triggers, which must name the Projection and have a
	// non-zero At (the time of the request).
	Rebuild *RebuildRequest
	// Redrive is set on ReasonRedrive triggers, which must name the Projection.
	Redrive *RedriveRequest
}

// ForAppend returns the trigger for an append's result.
func ForAppend(res eventstore.AppendResult, at time.Time) Trigger {
	t := Trigger{Position: res.Last(), Types: res.Types(), At: at, Reason: ReasonAppend}
	if len(res.Events) > 0 {
		t.StreamID = res.Events[0].StreamID
		t.Keys = []uint32{eventstore.PartitionKey(t.StreamID)}
	}
	return t
}

// MaxKeys is the most partition keys a trigger lists (Trigger.Keys); one covering more
// streams lists none (any stream).
const MaxKeys = 64

// ConcernsPartition reports whether the partition p of a projection may have work because of
// t: always for an unpartitioned p or a trigger without keys, else when a key falls in p.
func (t Trigger) ConcernsPartition(p eventstore.Partition) bool {
	if !p.Partitioned() || len(t.Keys) == 0 {
		return true
	}
	for _, k := range t.Keys {
		if p.ContainsKey(k) {
			return true
		}
	}
	return false
}

// Concerns reports whether a projection handling types (nil: every type) may have work
// because of t: true unless both list types and none of t's is one of the projection's.
func (t Trigger) Concerns(types []string) bool {
	if len(t.Types) == 0 || types == nil {
		return true
	}
	for _, typ := range t.Types {
		if slices.Contains(types, typ) {
			return true
		}
	}
	return false
}

type wire struct {
	V          *int            `json:"v"`
	Pos        string          `json:"pos,omitempty"`
	Stream     string          `json:"stream,omitempty"`
	Types      []string        `json:"types,omitempty"`
	Keys       []uint32        `json:"keys,omitempty"`
	At         time.Time       `json:"at"`
	Reason     Reason          `json:"reason,omitempty"`
	Projection string          `json:"for,omitempty"`
	Skip       *SkipRequest    `json:"skip,omitempty"`
	Rebuild    *RebuildRequest `json:"rebuild,omitempty"`
	Redrive    *RedriveRequest `json:"redrive,omitempty"`
}

// Encode returns t as JSON of at most MaxSize bytes. It refuses a reason Decode would refuse; a
// trigger without one is written as ReasonAppend.
func (t Trigger) Encode() ([]byte, error) {
	r, ok := reason(t.Reason)
	if !ok {
		return nil, fmt.Errorf("trigger: encode: unknown reason %q; use one of %q", t.Reason, Reasons())
	}
	v := Version
	w := wire{V: &v, Stream: t.StreamID, Types: t.Types, Keys: t.Keys, At: t.At.UTC(), Reason: r, Projection: t.Projection, Skip: t.Skip,
		Rebuild: t.Rebuild, Redrive: t.Redrive}
	if !t.Position.IsZero() {
		w.Pos = t.Position.String()
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("trigger: encode: %w", err)
	}
	if len(b) > MaxSize && len(w.Keys) > 0 {
		w.Keys = nil // "any stream" is always correct, only less precise
		if b, err = json.Marshal(w); err != nil {
			return nil, fmt.Errorf("trigger: encode: %w", err)
		}
	}
	if len(b) > MaxSize {
		w.Types = nil // "any type" is always correct, only less precise
		if b, err = json.Marshal(w); err != nil {
			return nil, fmt.Errorf("trigger: encode: %w", err)
		}
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("trigger: encoded trigger is %d bytes, more than %d", len(b), MaxSize)
	}
	return b, nil
}

var (
	// ErrInvalid matches every trigger that cannot be decoded. It is permanent: retrying the same
	// bytes cannot succeed.
	ErrInvalid = errors.New("trigger: invalid trigger")
	// ErrUnsupportedVersion matches a well-formed trigger of a version this build does not read.
	// It also matches ErrInvalid.
	ErrUnsupportedVersion = errors.New("trigger: unsupported trigger version")
)

// DecodeError says why bytes are not a trigger. It matches ErrInvalid, and ErrUnsupportedVersion
// when that is the reason.
type DecodeError struct {
	Reason  string
	Version int // the version found, when the reason is the version
	Err     error
}

func (e *DecodeError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("trigger: invalid trigger: %s: %v", e.Reason, e.Err)
	}
	return "trigger: invalid trigger: " + e.Reason
}

// Is makes errors.Is match ErrInvalid, and ErrUnsupportedVersion for version errors.
func (e *DecodeError) Is(target error) bool {
	return target == ErrInvalid || (target == ErrUnsupportedVersion && e.Version != 0)
}

// Unwrap returns the underlying JSON or position error.
func (e *DecodeError) Unwrap() error { return e.Err }

// Decode parses an encoded trigger.
func Decode(b []byte) (Trigger, error) {
	if len(b) > MaxSize {
		return Trigger{}, &DecodeError{Reason: fmt.Sprintf("%d bytes, more than the %d a trigger may have", len(b), MaxSize)}
	}
	var w wire
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&w); err != nil {
		return Trigger{}, &DecodeError{Reason: "not a JSON trigger object", Err: err}
	}
	if dec.More() {
		return Trigger{}, &DecodeError{Reason: "trailing data after the JSON object"}
	}
	switch {
	case w.V == nil:
		return Trigger{}, &DecodeError{Reason: `no version field "v"`}
	case *w.V != Version:
		return Trigger{}, &DecodeError{Reason: fmt.Sprintf("version %d; this build reads version %d", *w.V, Version), Version: *w.V}
	}
	r, err := w.request()
	if err != nil {
		return Trigger{}, err
	}
	t := Trigger{StreamID: w.Stream, Types: w.Types, Keys: w.Keys, At: w.At, Reason: r, Projection: w.Projection, Skip: w.Skip,
		Rebuild: w.Rebuild, Redrive: w.Redrive}
	if w.Pos != "" {
		p, err := eventstore.ParsePosition(w.Pos)
		if err != nil {
			return Trigger{}, &DecodeError{Reason: "bad position", Err: err}
		}
		t.Position = p
	}
	return t, nil
}

// request checks the reason of a decoded trigger and what that reason needs.
func (w *wire) request() (Reason, error) {
	r, ok := reason(w.Reason)
	switch {
	case !ok:
		return "", &DecodeError{Reason: fmt.Sprintf("unknown reason %q; this build knows %q", w.Reason, Reasons())}
	case r == ReasonSkip && (w.Skip == nil || w.Skip.EventID == uuid.Nil || w.Projection == ""):
		return "", &DecodeError{Reason: `a skip trigger needs "for" and "skip" with an event id`}
	case r == ReasonRebuild && (w.Projection == "" || w.At.IsZero()):
		return "", &DecodeError{Reason: `a rebuild trigger needs "for" and the request time "at"`}
	case r == ReasonRedrive && (w.Projection == "" || w.Redrive == nil):
		return "", &DecodeError{Reason: `a redrive trigger needs "for" and "redrive"`}
	}
	return r, nil
}

// MetadataKey is set on every trigger message, with the format version as value, so a consumer
// can tell triggers from other messages before decoding.
const MetadataKey = "nudge_trigger"

// NewMessage returns t as a Watermill message with a new id.
func NewMessage(t Trigger) (*message.Message, error) {
	payload, err := t.Encode()
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(MetadataKey, fmt.Sprint(Version))
	return msg, nil
}

// FromMessage decodes the trigger a message carries.
func FromMessage(msg *message.Message) (Trigger, error) {
	return Decode(msg.Payload)
}
