package retry

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// ErrPanicked matches every *PanicError.
var ErrPanicked = errors.New("retry: handler panicked")

// PanicError is a panic recovered from a handler by the innermost step of Middleware. It is
// retried like any error and dead-lettered by default once the retries are over, so a handler
// that always panics can never loop forever.
//
// It matches ErrPanicked, and errors.As also fills a middleware.RecoveredPanicError from it,
// so code written for Watermill's Recoverer keeps working. It does not unwrap to the panic
// value, even when that is an error: a panic stays a panic (never, say, a context
// cancellation that would be nacked forever).
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the panicking goroutine's stack trace.
	Stack string
}

// Error describes the panic without its stack trace, which stays in Stack: the dead-letter
// reason and log lines stay short.
func (e *PanicError) Error() string { return fmt.Sprintf("retry: handler panicked: %v", e.Value) }

// Is makes errors.Is(err, ErrPanicked) true.
func (e *PanicError) Is(target error) bool { return target == ErrPanicked }

// As fills a *middleware.RecoveredPanicError target, for code that looks for Watermill's.
func (e *PanicError) As(target any) bool {
	if t, ok := target.(*middleware.RecoveredPanicError); ok {
		*t = middleware.RecoveredPanicError{V: e.Value, Stacktrace: e.Stack}
		return true
	}
	return false
}

// recoverer is the innermost step: it turns a panic in h into a *PanicError.
func recoverer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (msgs []*message.Message, err error) {
		defer func() {
			if r := recover(); r != nil {
				msgs, err = nil, &PanicError{Value: r, Stack: string(debug.Stack())}
			}
		}()
		return h(msg)
	}
}
