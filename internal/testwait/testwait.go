// Package testwait says how long a test waits for what it expects before it fails.
//
// Every such deadline is an upper bound for a failure, never the time the thing is expected
// to take: on a busy shared machine (other test runs, the race detector, load of 8 to 40 on two
// cores) what takes milliseconds alone can take seconds, so tests wait on an event or a
// condition and give up only after a generous deadline. A test that passes never waits for a
// deadline to pass.
//
// NUDGE_TEST_TIMEOUT_SCALE multiplies every deadline, for machines slower still: a positive
// number such as 2 or 0.5; 1 when it is not set.
package testwait

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// ScaleEnv names the environment variable that multiplies every deadline.
const ScaleEnv = "NUDGE_TEST_TIMEOUT_SCALE"

// Scale returns the factor of ScaleEnv, or 1 when it is not set. It panics, saying what is
// wrong, when the variable is set to anything but a positive number.
func Scale() float64 {
	s := os.Getenv(ScaleEnv)
	if s == "" {
		return 1
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) || f > 1000 {
		panic(fmt.Sprintf("testwait: %s=%q: set it to a positive number such as 2 or 0.5, or unset it", ScaleEnv, s))
	}
	return f
}

// For returns d multiplied by Scale: how long to wait for something before failing the test.
func For(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Scale())
}

// Context returns a context that ends For(d) from now, or when t ends.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), For(d))
	t.Cleanup(cancel)
	return ctx
}
