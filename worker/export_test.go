package worker

import "time"

// The tests wait for retries of retired subscriptions' undeclares, not for production's pace.
func init() { retiredRetryInterval = 50 * time.Millisecond }
