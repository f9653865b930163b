package eventstore

import "strconv"

// ExpectedVersion states what the caller believes about a stream before appending to it; an
// append whose belief is wrong writes nothing and fails with ErrWrongExpectedVersion.
//
// The zero value is Any.
type ExpectedVersion struct {
	kind    expectKind
	version int64
}

type expectKind uint8

const (
	expectAny expectKind = iota
	expectNoStream
	expectExact
)

// Any accepts whatever version the stream is at, including a stream that does not exist yet.
var Any = ExpectedVersion{}

// NoStream requires that the stream has no events yet.
var NoStream = ExpectedVersion{kind: expectNoStream}

// Exact requires that the stream's last event has version v. Exact(0) means the same as NoStream.
// A negative v is rejected by Append with ErrInvalidInput.
func Exact(v int64) ExpectedVersion {
	return ExpectedVersion{kind: expectExact, version: v}
}

// Check reports whether a stream currently at version current (0: no events) satisfies e.
func (e ExpectedVersion) Check(current int64) bool {
	switch e.kind {
	case expectNoStream:
		return current == 0
	case expectExact:
		return current == e.version
	default:
		return true
	}
}

// Validate returns an error for an Exact version below zero.
func (e ExpectedVersion) Validate() error {
	if e.kind == expectExact && e.version < 0 {
		return &ValidationError{Field: "ExpectedVersion", Index: -1, Reason: "Exact version must be 0 or more (0 means the stream must not exist)"}
	}
	return nil
}

// String describes e for error messages: "any", "no stream" or "exactly 7".
func (e ExpectedVersion) String() string {
	switch e.kind {
	case expectNoStream:
		return "no stream"
	case expectExact:
		return "exactly " + strconv.FormatInt(e.version, 10)
	default:
		return "any"
	}
}
