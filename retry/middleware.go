package retry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Metadata keys the dead-letter step sets on a message just before it calls
// Config.DeadLetterFunc, so the dead-letter writer can store them.
const (
	// MetadataReason is the final error's message.
	MetadataReason = "nudge_dead_letter_reason"
	// MetadataStop is why the retries ended: a StopReason.
	MetadataStop = "nudge_dead_letter_stop"
	// MetadataAttempts is the number of attempts made, in decimal.
	MetadataAttempts = "nudge_dead_letter_attempts"
	// MetadataFirstFailure is when the first attempt failed, in TimeFormat.
	MetadataFirstFailure = "nudge_dead_letter_first_failure"
	// MetadataLastFailure is when the last attempt failed, in TimeFormat.
	MetadataLastFailure = "nudge_dead_letter_last_failure"
)

// TimeFormat is the format of the failure times in the metadata, always in UTC.
const TimeFormat = time.RFC3339Nano

// StopReason says why the retry step stopped trying a message.
type StopReason string

const (
	// StopPermanent: the error was marked with Permanent.
	StopPermanent StopReason = "permanent"
	// StopNotRetryable: Config.ShouldRetryFunc said no.
	StopNotRetryable StopReason = "not_retryable"
	// StopMaxAttempts: Policy.MaxAttempts attempts failed.
	StopMaxAttempts StopReason = "max_attempts"
	// StopMaxElapsedTime: the next wait would have ended after Policy.MaxElapsedTime.
	StopMaxElapsedTime StopReason = "max_elapsed_time"
	// StopCanceled: the message's context ended (usually a shutdown). Such a message is never
	// dead-lettered: it is nacked and comes back.
	StopCanceled StopReason = "canceled"
)

// StopReasons lists every StopReason.
func StopReasons() []StopReason {
	return []StopReason{StopPermanent, StopNotRetryable, StopMaxAttempts, StopMaxElapsedTime, StopCanceled}
}

// GiveUpError is what the retry step returns when it stops trying a message. It unwraps to
// the last attempt's error (and, when the message's context ended, to the context's error as
// well), so errors.Is and errors.As see through it.
type GiveUpError struct {
	// Stop is why the retries ended.
	Stop StopReason
	// Attempts is the number of attempts made, the first included.
	Attempts int
	// FirstFailure and LastFailure are when the first and the last attempt failed.
	FirstFailure, LastFailure time.Time
	// Err is the last attempt's error.
	Err error
	// ContextErr is the message context's error when Stop is StopCanceled, else nil.
	ContextErr error
}

func (e *GiveUpError) Error() string {
	if e.Stop == StopCanceled {
		return fmt.Sprintf("retry: stopped after %s because the message's context ended (%v); last error: %v",
			attempts(e.Attempts), e.ContextErr, e.Err)
	}
	return fmt.Sprintf("retry: gave up after %s (%s): %v", attempts(e.Attempts), e.Stop, e.Err)
}

// Unwrap returns the context's error, if any, and the last attempt's error.
func (e *GiveUpError) Unwrap() []error {
	if e.ContextErr != nil {
		return []error{e.ContextErr, e.Err}
	}
	return []error{e.Err}
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return strconv.Itoa(n) + " attempts"
}

// RetryParams describes a failed attempt that is about to be retried.
type RetryParams struct {
	// Message is the message being handled.
	Message *message.Message
	// Handler is the router handler's name ("" outside a router).
	Handler string
	// Attempt is the number of the attempt that failed; 1 is the first.
	Attempt int
	// Delay is the wait before the next attempt.
	Delay time.Duration
	// Err is the attempt's error.
	Err error
}

// Config configures Middleware.
type Config struct {
	// Policy says how often and how long to retry. Zero fields take their defaults.
	Policy Policy
	// DeadLetterFunc writes a message whose retries are over to durable storage. Required.
	// It gets the message, with the Metadata… keys set, and the final error (usually a
	// *GiveUpError; errors.As finds a *PanicError in it after a panic). The message is acked
	// only if it returns nil, so return nil only once the dead letter is written (committed);
	// on an error the handler returns both errors, the message is nacked and comes back.
	// msg.Context() is still alive when it is called. It may be called concurrently.
	DeadLetterFunc func(msg *message.Message, err error) error
	// ShouldDeadLetterFunc says which final errors go to the dead letters; the others are
	// returned, so the message is nacked and comes back. A message whose context has ended
	// is never dead-lettered, whatever it says. Defaults to ShouldDeadLetterDefault: compose
	// with it to add errors rather than replace it, or a handler that always panics would be
	// redelivered forever.
	ShouldDeadLetterFunc func(err error) bool
	// ShouldRetryFunc says which errors are worth another attempt. Errors marked with
	// Permanent are never retried, whatever it says. Defaults to ShouldRetryDefault.
	ShouldRetryFunc func(err error) bool
	// OnRetryFunc, if set, is called before each wait, e.g. to count retries.
	OnRetryFunc func(RetryParams)
	// Logger gets a warning for each retry and each dead letter, and an error when a dead
	// letter cannot be written. Defaults to slog.Default().
	Logger *slog.Logger
	// NowFunc tells the time, for MaxElapsedTime and the failure times. Defaults to
	// time.Now.
	NowFunc func() time.Time
	// RandFunc returns a uniform random number in [0, 1) for the jitter. Defaults to
	// math/rand/v2's Float64.
	RandFunc func() float64
	// SleepFunc waits d, or until ctx ends, and then returns ctx's error if it ended. Defaults
	// to a timer that honours ctx.
	SleepFunc func(ctx context.Context, d time.Duration) error
}

// WithDefaults returns cfg with every zero field that has a default set to it, Policy's
// included.
func (cfg Config) WithDefaults() Config {
	cfg.Policy = cfg.Policy.WithDefaults()
	if cfg.ShouldDeadLetterFunc == nil {
		cfg.ShouldDeadLetterFunc = ShouldDeadLetterDefault
	}
	if cfg.ShouldRetryFunc == nil {
		cfg.ShouldRetryFunc = ShouldRetryDefault
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	if cfg.RandFunc == nil {
		cfg.RandFunc = rand.Float64
	}
	if cfg.SleepFunc == nil {
		cfg.SleepFunc = sleep
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig: a missing DeadLetterFunc, or Policy's *PolicyError values.
func (cfg Config) Validate() error {
	if cfg.DeadLetterFunc == nil {
		return fmt.Errorf("%w: Config.DeadLetterFunc is required: it stores the messages whose retries are over "+
			"(return nil only once the dead letter is written)", ErrInvalidConfig)
	}
	if cfg.ShouldDeadLetterFunc == nil || cfg.ShouldRetryFunc == nil || cfg.Logger == nil || cfg.NowFunc == nil ||
		cfg.RandFunc == nil || cfg.SleepFunc == nil {
		return fmt.Errorf("%w: a Config function or Logger is nil; call WithDefaults first", ErrInvalidConfig)
	}
	return cfg.Policy.Validate()
}

// ShouldRetryDefault retries every error except permanent ones and context cancellations and
// deadlines.
func ShouldRetryDefault(err error) bool {
	return !IsPermanent(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// ShouldDeadLetterDefault dead-letters permanent errors and recovered panics (a *PanicError, or
// Watermill's middleware.RecoveredPanicError).
func ShouldDeadLetterDefault(err error) bool {
	var watermillPanic middleware.RecoveredPanicError
	return IsPermanent(err) || errors.Is(err, ErrPanicked) || errors.As(err, &watermillPanic)
}

// Middleware returns the three steps of retrying a handler, to add to one handler, in this
// order, with (*message.Handler).AddMiddleware(mw...):
//
//  1. dead letters (outermost): a final error that ShouldDeadLetterFunc accepts is written with
//     DeadLetterFunc and the message acked — unless the message's context has ended;
//  2. retries: attempts the handler up to Policy.MaxAttempts times, waiting Policy.Delay in
//     between, within Policy.MaxElapsedTime; it stops at once on a permanent error, on an error
//     ShouldRetryFunc refuses and when the message's context ends (returning an error that
//     matches the context's error);
//  3. panic recovery (innermost): a panic becomes a *PanicError, retried like an error.
//
// Errors that are not dead-lettered are returned: the subscriber nacks the message and it
// comes back. The waits happen inside the handler, holding the message: keep the policy's
// budget below the broker's ack deadline. Add them at handler level, not router level: a
// router-level recoverer added before them would hide panics from the retries and the dead
// letters, and the message would be redelivered forever.
func Middleware(cfg Config) ([]message.HandlerMiddleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &steps{cfg: cfg}
	return []message.HandlerMiddleware{s.deadLetter, s.retry, recoverer}, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

type steps struct {
	cfg Config
}

// retry is the retry step.
func (s *steps) retry(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		start := s.cfg.NowFunc()
		var first time.Time
		for attempt := 1; ; attempt++ {
			msgs, err := h(msg)
			if err == nil {
				return msgs, nil
			}
			now := s.cfg.NowFunc()
			if attempt == 1 {
				first = now
			}
			giveUp := func(stop StopReason, ctxErr error) error {
				return &GiveUpError{Stop: stop, Attempts: attempt, FirstFailure: first, LastFailure: now, Err: err, ContextErr: ctxErr}
			}
			delay, stop, ctxErr := s.next(ctx, err, attempt, now.Sub(start))
			if stop != "" {
				return nil, giveUp(stop, ctxErr)
			}
			s.announce(ctx, msg, attempt, delay, err)
			if sleepErr := s.cfg.SleepFunc(ctx, delay); sleepErr != nil {
				return nil, giveUp(StopCanceled, sleepErr)
			}
		}
	}
}

// next decides what follows the failed attempt number attempt, elapsed after the first began:
// the delay before the next attempt, or why the step gives up (with the context's error when
// it ended).
func (s *steps) next(ctx context.Context, err error, attempt int, elapsed time.Duration) (time.Duration, StopReason, error) {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return 0, StopCanceled, ctxErr
	}
	if IsPermanent(err) {
		return 0, StopPermanent, nil
	}
	if !s.cfg.ShouldRetryFunc(err) {
		return 0, StopNotRetryable, nil
	}
	if attempt >= s.cfg.Policy.MaxAttempts {
		return 0, StopMaxAttempts, nil
	}
	delay := s.cfg.Policy.Delay(attempt, s.cfg.RandFunc())
	if limit := s.cfg.Policy.MaxElapsedTime; limit > 0 && elapsed+delay > limit {
		return 0, StopMaxElapsedTime, nil
	}
	return delay, "", nil
}

// announce tells OnRetryFunc and the log that attempt failed with err and the next one follows
// after delay.
func (s *steps) announce(ctx context.Context, msg *message.Message, attempt int, delay time.Duration, err error) {
	handler := message.HandlerNameFromCtx(ctx)
	if s.cfg.OnRetryFunc != nil {
		s.cfg.OnRetryFunc(RetryParams{Message: msg, Handler: handler, Attempt: attempt, Delay: delay, Err: err})
	}
	s.cfg.Logger.WarnContext(ctx, "handler failed; retrying",
		slog.String("handler", handler), slog.String("message_uuid", msg.UUID),
		slog.Int("attempt", attempt), slog.Int("max_attempts", s.cfg.Policy.MaxAttempts),
		slog.Duration("delay", delay), slog.Any("error", err))
}

// deadLetter is the dead-letter step.
func (s *steps) deadLetter(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msgs, err := h(msg)
		if err == nil {
			return msgs, nil
		}
		ctx := msg.Context()
		if ctx.Err() != nil || !s.cfg.ShouldDeadLetterFunc(err) {
			// A shutdown is not a failure: the message comes back.
			return nil, err
		}

		giveUp := &GiveUpError{Attempts: 1, Err: err}
		if !errors.As(err, &giveUp) { // no retry step in front of the handler
			giveUp.FirstFailure = s.cfg.NowFunc()
			giveUp.LastFailure = giveUp.FirstFailure
		}
		msg.Metadata.Set(MetadataReason, giveUp.Err.Error())
		if giveUp.Stop != "" {
			msg.Metadata.Set(MetadataStop, string(giveUp.Stop))
		}
		msg.Metadata.Set(MetadataAttempts, strconv.Itoa(giveUp.Attempts))
		msg.Metadata.Set(MetadataFirstFailure, giveUp.FirstFailure.UTC().Format(TimeFormat))
		msg.Metadata.Set(MetadataLastFailure, giveUp.LastFailure.UTC().Format(TimeFormat))

		attrs := []any{
			slog.String("handler", message.HandlerNameFromCtx(ctx)), slog.String("message_uuid", msg.UUID),
			slog.String("stop", string(giveUp.Stop)), slog.Int("attempts", giveUp.Attempts), slog.Any("error", giveUp.Err),
		}
		if dlErr := s.cfg.DeadLetterFunc(msg, err); dlErr != nil {
			s.cfg.Logger.ErrorContext(ctx, "could not write a dead letter; the message is nacked and comes back",
				append(attrs, slog.Any("dead_letter_error", dlErr))...)
			return nil, errors.Join(err, fmt.Errorf("retry: write the dead letter (the message is nacked): %w", dlErr))
		}
		var panicked *PanicError
		if errors.As(err, &panicked) {
			attrs = append(attrs, slog.String("stack", panicked.Stack))
		}
		s.cfg.Logger.WarnContext(ctx, "message dead-lettered", attrs...)
		return nil, nil
	}
}
