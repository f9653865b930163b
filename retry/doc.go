// Package retry retries a failing Watermill handler with exponential backoff and jitter, and
// sends the messages whose retries are over to durable dead letters.
//
// A Policy says how often and how long: MaxAttempts, an InitialInterval that grows by Multiplier
// up to MaxInterval, a Jitter spread, and a MaxElapsedTime budget. Policy.Delay is the pure
// function behind the waits. An error marked with Permanent skips the retries.
//
// Middleware returns three handler middlewares, in the order to add them (the first added is the
// outermost):
//
//	dead letters → retries → panic recovery → your handler
//
// A panic is recovered innermost, so it is retried and then dead-lettered like an error, never
// redelivered forever. A final error is dead-lettered if Config.ShouldDeadLetterFunc accepts it
// (by default: permanent errors and panics): the message is acked only once
// Config.DeadLetterFunc has written it, and nacked if that fails. Other errors (a database that
// is down, say) are returned, so the message is nacked and comes back later. When the message's
// context ends — the router is shutting down — the retries stop at once and nothing is
// dead-lettered: a shutdown is not a failure.
//
// The retry loop is this package's own rather than Watermill's middleware.Retry, whose
// OnRetryHook and ShouldRetry make the backoff grow faster than configured.
//
// Wiring one handler:
//
//	mw, err := retry.Middleware(retry.Config{
//		Policy: retry.Policy{MaxAttempts: 5},
//		DeadLetterFunc: func(msg *message.Message, err error) error {
//			return deadLetters.Write(msg.Context(), msg) // the Metadata… keys say why and when
//		},
//		ShouldDeadLetterFunc: func(err error) bool {
//			return retry.ShouldDeadLetterDefault(err) || errors.Is(err, projection.ErrHandler)
//		},
//	})
//	if err != nil {
//		return err
//	}
//	router.AddConsumerHandler("orders", "orders", sub, handle).AddMiddleware(mw...)
package retry
