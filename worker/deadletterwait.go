package worker

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// Waits of a trigger whose dead letter could not be written, before it is nacked: the first,
// and the cap. A nacked trigger comes straight back on RabbitMQ and GoChannel (the PostgreSQL
// queue resends it after its ResendInterval), and one that fails at once (a permanent error,
// no retries) would otherwise meet the refusing dead-letter store again in a hot loop. The
// cap keeps the retries, DeadLetterTimeout and this wait within the PostgreSQL queue's
// default AckDeadline (30 s).
var (
	deadLetterWaitInitial = 100 * time.Millisecond
	deadLetterWaitMax     = 5 * time.Second
)

// deadLetterFailed waits, before the trigger whose dead letter could not be written is nacked,
// a delay that doubles with each failed write of the projection in a row (deadLetterWaitInitial
// up to deadLetterWaitMax, ±20 %), or until ctx ends.
func (w *Worker) deadLetterFailed(ctx context.Context, c *counters, log *slog.Logger) {
	n := c.deadLetterFailures.Add(1)
	d := backoff.Delay(deadLetterWaitInitial, deadLetterWaitMax, 2, 0.2, int(min(n, 64)), rand.Float64())
	c.deadLetterWaits.Add(1)
	log.DebugContext(ctx, "the dead letter could not be written; the trigger is nacked after a wait",
		slog.Int64("failures_in_a_row", n), slog.Duration("wait", d))
	_ = w.sleepFunc(ctx, d)
}
