package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// timeoutScaleEnv names the environment variable that sets -timeout-scale's default
// (make chaos passes CHAOS_TIMEOUT_SCALE as the flag; make chaos-loaded sets it to 3).
const timeoutScaleEnv = "CHAOS_TIMEOUT_SCALE"

// timeoutScaleMax bounds -timeout-scale.
const timeoutScaleMax = 20

// timeoutScale multiplies every deadline of the harness (how long it waits for a worker to
// be ready, a build to progress, a cut-over to come, the projections to catch up) and the
// default budget: on a busy machine what takes a second alone can take several. It never
// scales a bound the suite asserts about the product (the safety net's, the relay's, the
// leases' takeover): those are what the checks are for. Set once by run, before any
// scenario.
var timeoutScale = 1.0

// deadline is d scaled by timeoutScale: how long the harness waits for something before it
// fails the scenario, never how long the thing is expected to take.
func deadline(d time.Duration) time.Duration {
	return time.Duration(float64(d) * timeoutScale)
}

// timeoutScaleDefault is timeoutScaleEnv's value, 1 when it is not set.
func timeoutScaleDefault() (float64, error) {
	s := os.Getenv(timeoutScaleEnv)
	if s == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: set it to a number from 1 to %d, or unset it", timeoutScaleEnv, s, timeoutScaleMax)
	}
	return f, nil
}
