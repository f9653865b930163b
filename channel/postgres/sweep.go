package postgres

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// sweepJitter spreads the sweeps of channels started together: each wait is
// ListeningPollInterval ± this fraction of it.
const sweepJitter = 0.1

// sweep is the channel's one fallback poll while its listener listens. Every
// ListeningPollInterval one statement looks for triggers queued for any projection subscribed
// through the channel, and wakes the subscriptions of those that have some; the subscriptions
// themselves do not poll while the listener listens. A trigger whose notification never
// arrived (an insert with triggers disabled, a notification lost on its way) is therefore
// delivered within ListeningPollInterval, and an idle channel costs one statement per
// ListeningPollInterval however many projections it carries, instead of one poll per
// subscription.
//
// The statement reads only the queue's index on (projection, offset): one probe per
// projection, no transaction of its own beyond the statement's.
type sweep struct {
	mu sync.Mutex
	// subs are the waits to wake, by projection (several subscriptions may consume one
	// projection).
	subs map[string]map[*wakeBackoff]struct{}
}

func newSweep() *sweep { return &sweep{subs: map[string]map[*wakeBackoff]struct{}{}} }

// add makes the sweep wake b when projection has queued triggers, until remove.
func (s *sweep) add(projection string, b *wakeBackoff) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[projection] == nil {
		s.subs[projection] = map[*wakeBackoff]struct{}{}
	}
	s.subs[projection][b] = struct{}{}
	b.swept.Store(true)
}

// remove undoes add.
func (s *sweep) remove(projection string, b *wakeBackoff) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.subs[projection], b)
	if len(s.subs[projection]) == 0 {
		delete(s.subs, projection)
	}
}

// projections returns the projections subscribed now.
func (s *sweep) projections() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.subs))
	for p := range s.subs {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// wake wakes projection's subscriptions; it never blocks (a wake-up already pending is kept).
func (s *sweep) wake(projection string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for b := range s.subs[projection] {
		select {
		case b.nudged <- struct{}{}:
		default:
		}
	}
}

// run sweeps every ListeningPollInterval (jittered) while the listener listens, until ctx
// ends. While it does not, the subscriptions poll every PollInterval themselves.
func (c *Channel) runSweep(ctx context.Context) {
	for {
		wait := time.Duration(float64(c.cfg.ListeningPollInterval) * (1 - sweepJitter + 2*sweepJitter*rand.Float64()))
		if backoff.Sleep(ctx, wait) != nil {
			return
		}
		if !c.listener.Listening() {
			continue
		}
		woken, err := c.sweepOnce(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.WarnContext(ctx, "postgres channel: the fallback poll of the subscriptions' queues failed; it runs again in ListeningPollInterval",
					slog.Any("error", c.translate(err)), slog.Duration("listening_poll_interval", c.cfg.ListeningPollInterval))
			}
			continue
		}
		if c.cfg.sweptFunc != nil {
			c.cfg.sweptFunc(woken)
		}
	}
}

// sweepOnce looks for queued triggers of every subscribed projection, in one statement, wakes
// the subscriptions of those that have some and returns them.
func (c *Channel) sweepOnce(ctx context.Context) ([]string, error) {
	projections := c.sweep.projections()
	if len(projections) == 0 {
		return nil, nil
	}
	rows, err := c.db.Query(ctx, `SELECT p FROM unnest($1::text[]) p
		WHERE EXISTS (SELECT FROM `+c.tables.triggers+` t WHERE t.projection = p)`, projections)
	if err != nil {
		return nil, err
	}
	queued, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, p := range queued {
		c.sweep.wake(p)
	}
	if len(queued) > 0 {
		c.log.DebugContext(ctx, "postgres channel: the fallback poll found queued triggers; their subscriptions poll now", slog.Any("projections", queued))
	}
	return queued, nil
}
