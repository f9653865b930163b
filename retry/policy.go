package retry

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// Defaults for Policy. With all of them a failing message is tried 5 times, waiting about
// 200 ms, 400 ms, 800 ms and 1.6 s (±20 %) in between: about 3 s of waiting in all, at most
// 3.6 s, so a short outage (a database failover, a broker reconnect) is ridden out, while a
// poison message reaches the dead letters within seconds and holds its subscription no longer.
const (
	// MaxAttemptsDefault is the number of attempts, the first included. Four retries cover a
	// few seconds of outage; more would only delay the dead letter of a message that cannot
	// succeed, and a projection that is still failing catches up later from its own position
	// anyway (the next trigger or the safety-net tick).
	MaxAttemptsDefault = 5
	// InitialIntervalDefault is the wait before the second attempt: long enough for a lock or a
	// serialisation conflict to clear, short enough not to add visible latency to a hiccup.
	InitialIntervalDefault = 200 * time.Millisecond
	// MaxIntervalDefault caps the un-jittered wait between attempts. The default attempts never
	// reach it (the fourth wait is 1.6 s); it bounds policies with more attempts, since the
	// retry step sleeps inside the handler and holds its message meanwhile.
	MaxIntervalDefault = 10 * time.Second
	// MultiplierDefault doubles the wait after each attempt.
	MultiplierDefault = 2.0
	// JitterDefault spreads each wait uniformly over ±20 %, so the projections a single outage
	// failed together do not retry in lockstep.
	JitterDefault = 0.2
	// MaxElapsedTimeDefault bounds the time from the first attempt until the last retry starts.
	// Brokers redeliver a message that stays unacknowledged too long: the PostgreSQL queue's
	// AckDeadline is 30 s by default, RabbitMQ's consumer_timeout 30 min. 20 s leaves 10 s
	// below the tightest of them for the last attempt and the dead-letter write, so a message
	// is never handled twice at once just because it was being retried.
	MaxElapsedTimeDefault = 20 * time.Second
)

// Policy says how often and how long to retry. The zero value of a field means its default
// (WithDefaults fills them in); the Middleware applies defaults and then Validate.
//
// The wait before retry n (n = 1 is the wait before the second attempt) is
// InitialInterval × Multiplier^(n−1), capped at MaxInterval, then spread uniformly over
// ±Jitter of itself: see Delay.
type Policy struct {
	// MaxAttempts is the number of attempts, the first included; 1 means no retry. Defaults to
	// MaxAttemptsDefault.
	MaxAttempts int
	// InitialInterval is the wait before the second attempt. Defaults to
	// InitialIntervalDefault.
	InitialInterval time.Duration
	// MaxInterval caps the wait before jitter (with jitter a wait can reach
	// MaxInterval × (1 + Jitter)). Defaults to MaxIntervalDefault, or to InitialInterval if
	// that is longer.
	MaxInterval time.Duration
	// Multiplier is the factor the wait grows by after each retry; 1 keeps it constant.
	// Defaults to MultiplierDefault.
	Multiplier float64
	// Jitter is the randomisation factor, in [0, 1): each wait is spread uniformly over
	// ±Jitter of itself. Defaults to JitterDefault; a negative value turns jitter off.
	Jitter float64
	// MaxElapsedTime bounds the time from the start of the first attempt until the last retry
	// starts: no retry is started whose wait would end after it. The last attempt itself may
	// run past it. Defaults to MaxElapsedTimeDefault; a negative value means no limit. Keep it,
	// plus one attempt and the dead-letter write, below the broker's ack deadline.
	MaxElapsedTime time.Duration
}

// WithDefaults returns p with every zero field set to its default.
func (p Policy) WithDefaults() Policy {
	p.MaxAttempts = cmp.Or(p.MaxAttempts, MaxAttemptsDefault)
	p.InitialInterval = cmp.Or(p.InitialInterval, InitialIntervalDefault)
	p.MaxInterval = cmp.Or(p.MaxInterval, max(MaxIntervalDefault, p.InitialInterval))
	p.Multiplier = cmp.Or(p.Multiplier, MultiplierDefault)
	p.Jitter = cmp.Or(p.Jitter, JitterDefault)
	p.MaxElapsedTime = cmp.Or(p.MaxElapsedTime, MaxElapsedTimeDefault)
	return p
}

// ErrInvalidConfig is matched (errors.Is) by every error Policy.Validate, Config.Validate and
// Middleware return for a Policy or Config they cannot use.
var ErrInvalidConfig = errors.New("retry: invalid config")

// PolicyError is a Policy field that cannot work. It matches ErrInvalidConfig.
type PolicyError struct {
	// Field is the Policy field, e.g. "Jitter".
	Field string
	// Value is the field's value, as text.
	Value string
	// Rule says what is allowed.
	Rule string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("retry: invalid policy: %s is %s; %s", e.Field, e.Value, e.Rule)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *PolicyError) Is(target error) bool { return target == ErrInvalidConfig }

// Validate reports every field of p that cannot work, as *PolicyError values joined with
// errors.Join; nil if p is usable. It checks p as it is: call it on p.WithDefaults() unless
// every field is set.
func (p Policy) Validate() error {
	var errs []error
	bad := func(field, value, rule string) {
		errs = append(errs, &PolicyError{Field: field, Value: value, Rule: rule})
	}
	if p.MaxAttempts < 1 {
		bad("MaxAttempts", fmt.Sprint(p.MaxAttempts), "it must be at least 1 (1 means no retry; WithDefaults turns 0 into the default)")
	}
	if p.InitialInterval <= 0 {
		bad("InitialInterval", p.InitialInterval.String(), "it must be positive (WithDefaults turns 0 into the default)")
	}
	if p.MaxInterval < p.InitialInterval {
		bad("MaxInterval", p.MaxInterval.String(), fmt.Sprintf("it must be at least InitialInterval (%s)", p.InitialInterval))
	}
	if math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0) || p.Multiplier < 1 {
		bad("Multiplier", fmt.Sprint(p.Multiplier), "it must be a finite number of at least 1 (1 keeps the wait constant)")
	}
	if math.IsNaN(p.Jitter) || p.Jitter >= 1 {
		bad("Jitter", fmt.Sprint(p.Jitter), "it must be below 1 (0.2 spreads each wait over ±20%; a negative value turns jitter off)")
	}
	return errors.Join(errs...)
}

// Delay returns the wait before retry number retry (1 is the wait before the second attempt;
// below 1 it returns 0), for random in [0, 1) (values outside are clamped into it). It is a
// pure function of p, retry and random:
//
//	d     = min(InitialInterval × Multiplier^(retry−1), MaxInterval)
//	delay = d × (1 + Jitter × (2×random − 1)), rounded to the nanosecond
//
// so random 0 gives d×(1−Jitter), 0.5 gives d and values close to 1 give d×(1+Jitter). A
// negative Jitter means none. Delay uses p as it is: apply WithDefaults first.
func (p Policy) Delay(retry int, random float64) time.Duration {
	return backoff.Delay(p.InitialInterval, p.MaxInterval, p.Multiplier, p.Jitter, retry, random)
}
