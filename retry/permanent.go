package retry

import "errors"

// ErrPermanent matches every error marked with Permanent.
var ErrPermanent = errors.New("retry: permanent error")

// PermanentError marks an error that retrying cannot fix: the retry step stops at once, and by
// default the message is dead-lettered. Make one with Permanent. It matches ErrPermanent and
// unwraps to the error it marks; its message is that error's, unchanged.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return e.Err.Error() }

// Is makes errors.Is(err, ErrPermanent) true.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Unwrap returns the marked error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent: the message is not retried, whatever
// Config.ShouldRetryFunc says, and is dead-lettered by default. Use it for failures that the
// same message can never get past, such as a payload that does not decode. Permanent(nil)
// returns nil.
//
// The mark survives wrapping: fmt.Errorf("…: %w", Permanent(err)) is permanent too.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or an error it wraps, is marked permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// Permanent reports true: packages that cannot import this one (projection) recognise a
// permanent error by this method.
func (e *PermanentError) Permanent() bool { return true }
