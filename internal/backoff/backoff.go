// Package backoff is nudge's one backoff: waits that grow exponentially from an initial one up
// to a cap, each spread over ±jitter of itself. retry.Policy (the trigger retries) computes its
// waits with Delay; the poller's idle and failing waits, the worker's wait for a readable
// position, the event store's retries of conflicting appends and the RabbitMQ channel's start-up
// dials step through an Exponential.
//
// It is the project's own rather than a library's (cenkalti/backoff/v5 has the same formula)
// because the retry middleware needs the wait as a pure function of the attempt and an injected
// random number (its tests pin every wait), and because the stores must not import the
// Watermill-bound retry package for it.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry number n (1 is the wait before the second attempt; below
// 1 it returns 0), for random in [0, 1) (values outside are clamped into it):
//
//	d     = min(initial × multiplier^(n−1), maxWait)
//	delay = d × (1 + jitter × (2×random − 1)), rounded to the nanosecond
//
// so random 0 gives d×(1−jitter), 0.5 gives d and values close to 1 give d×(1+jitter). A jitter
// of 0 or below means none.
func Delay(initial, maxWait time.Duration, multiplier, jitter float64, n int, random float64) time.Duration {
	if n < 1 {
		return 0
	}
	d := float64(initial) * math.Pow(multiplier, float64(n-1))
	if maxD := float64(maxWait); d > maxD || math.IsNaN(d) {
		d = maxD
	}
	if jitter > 0 {
		random = min(max(random, 0), math.Nextafter(1, 0))
		d *= 1 + jitter*(2*random-1)
	}
	switch {
	case d <= 0 || math.IsNaN(d):
		return 0
	case d >= math.MaxInt64: // float64(math.MaxInt64) is 2^63, which does not fit
		return math.MaxInt64
	}
	return time.Duration(math.Round(d))
}

// Exponential steps through the waits of Delay: Next returns the wait before the next retry,
// Reset starts over. Not safe for concurrent use.
type Exponential struct {
	// Initial is the first wait.
	Initial time.Duration
	// Max caps the wait before jitter.
	Max time.Duration
	// Multiplier is the growth per step; 0 means 2.
	Multiplier float64
	// Jitter spreads each wait over ±Jitter of itself; 0 means none.
	Jitter float64
	// RandFunc returns a number in [0, 1); nil means math/rand/v2's Float64.
	RandFunc func() float64

	n int
}

// Next returns the next wait.
func (b *Exponential) Next() time.Duration {
	b.n++
	random := 0.5
	if b.Jitter > 0 {
		if b.RandFunc != nil {
			random = b.RandFunc()
		} else {
			random = rand.Float64()
		}
	}
	multiplier := b.Multiplier
	if multiplier == 0 {
		multiplier = 2
	}
	return Delay(b.Initial, b.Max, multiplier, b.Jitter, b.n, random)
}

// Reset makes the next wait the first again.
func (b *Exponential) Reset() { b.n = 0 }

// Sleep waits for d, or until ctx ends (then it returns ctx's error).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
