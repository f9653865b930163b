package nudge

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/worker"
)

// ErrCloseTimeout is returned by ClosePools when the pools did not close within CloseTimeout.
var ErrCloseTimeout = errors.New("nudge: the pools did not close within CloseTimeout (is a database partitioned away?); " +
	"their last connections are left to close in the background, or with the process")

// ClosePools closes pools (a *pgxpool.Pool each: the client's, the dead letters' own, the
// channel's) after Run or RunBackground has returned, waiting at most Config.CloseTimeout for
// them; then it returns an error matching ErrCloseTimeout and logs a warning, and the process
// can exit. A pgx pool's Close waits for every connection to close, and a connection to a
// database partitioned away (open, answering nothing) takes up to 15 s to give up: pgx then
// waits that long for the server to acknowledge the cancel of an interrupted query, and for
// the connection's terminate. Nothing is lost by not waiting: no trigger is acked unless its
// work committed or its dead letter was written.
func (c *Client) ClosePools(pools ...interface{ Close() }) error {
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Go(p.Close)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	bound := cmp.Or(c.cfg.CloseTimeout, worker.CloseTimeoutDefault)
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-timer.C:
		c.cfg.Logger.Warn("closing the pools did not finish within CloseTimeout; their last connections close in the background",
			slog.Duration("close_timeout", bound))
		return fmt.Errorf("%w (%s)", ErrCloseTimeout, bound)
	}
}
