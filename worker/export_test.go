package worker

import "time"

// The tests wait for retries of retired subscriptions' undeclares, not for production's pace.
func init() { retiredRetryInterval = 50 * time.Millisecond }

// DeadLetterWaits counts the waits of the named projection's triggers whose dead letter could
// not be written, before their nack.
func DeadLetterWaits(w *Worker, name string) int64 { return w.stats[name].deadLetterWaits.Load() }

// WithSafetyNetTickFunc returns cfg with f called with each safety-net tick's number, once
// every projection was handed it.
func WithSafetyNetTickFunc(cfg Config, f func(n int)) Config {
	cfg.safetyNetTickFunc = f
	return cfg
}
