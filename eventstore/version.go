package eventstore

import (
	"math"
	"strconv"
)

// ExpectedVersion states what the caller believes about a stream before appending to it; an
// append whose belief is wrong writes nothing and fails with ErrWrongExpectedVersion. Use Any,
// NoStream or Exact(v); the zero value is Any.
type ExpectedVersion int64

const (
	// Any accepts whatever version the stream is at, including a stream that does not exist
	// yet.
	Any ExpectedVersion = 0
	// NoStream requires that the stream has no events yet.
	NoStream ExpectedVersion = -1
	// badExact is Exact of a negative version, which Validate refuses.
	badExact ExpectedVersion = math.MinInt64
)

// Exact requires that the stream's last event has version v. Exact(0) means the same as NoStream.
// A negative v is rejected by Append with ErrInvalidInput.
func Exact(v int64) ExpectedVersion {
	if v < 0 || v == math.MaxInt64 {
		return badExact
	}
	return ExpectedVersion(v + 1) // 1 and up: Exact(v)
}

// exact reports the version e requires, if it is an Exact one.
func (e ExpectedVersion) exact() (int64, bool) {
	if e > 0 {
		return int64(e) - 1, true
	}
	return 0, false
}

// Check reports whether a stream currently at version current (0: no events) satisfies e.
func (e ExpectedVersion) Check(current int64) bool {
	if v, ok := e.exact(); ok {
		return current == v
	}
	switch e {
	case Any:
		return true
	case NoStream:
		return current == 0
	default:
		return false
	}
}

// Validate returns an error for an Exact version below zero (or a value not made by Any,
// NoStream or Exact).
func (e ExpectedVersion) Validate() error {
	if e >= NoStream {
		return nil
	}
	return &ValidationError{Field: "ExpectedVersion", Index: -1, Reason: "Exact version must be 0 or more (0 means the stream must not exist)"}
}

// String describes e for error messages: "any", "no stream" or "exactly 7".
func (e ExpectedVersion) String() string {
	if v, ok := e.exact(); ok {
		return "exactly " + strconv.FormatInt(v, 10)
	}
	switch e {
	case Any:
		return "any"
	case NoStream:
		return "no stream"
	default:
		return "invalid (a negative Exact version)"
	}
}
