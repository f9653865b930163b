package worker

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/projection"
)

// retiredRetryInterval is how often the worker tries again to undeclare a retired version's
// subscription that it could not undeclare (one that a worker of that version still consumes).
var retiredRetryInterval = 10 * time.Second

// retiredTimeout bounds one Undeclare.
const retiredTimeout = 10 * time.Second

// retiredSubscriptions undeclares, on channels that keep triggers for absent consumers
// (channel.Undeclarer), the subscriptions of the versions that the worker's projections
// replaced. Once a version is active, the versions before it are retired and their batches do
// nothing: a queue of theirs that no worker consumes any more would keep every trigger
// published for good, and on RabbitMQ make every publish wait until the trigger is on the
// broker's disk. The worker undeclares them when its catch-up cuts over, and once after its
// start when it runs an active version newer than the first. A subscription that a worker of
// the old version still consumes (a rolling deploy) is kept and tried again
// (retiredRetryInterval) on the worker's next catch-ups: RabbitMQ refuses to delete a queue
// with a consumer. Retired versions of another partitioning (their partitions' subscriptions)
// are not found this way.
type retiredSubscriptions struct {
	ch  channel.Undeclarer // nil: the channel keeps nothing for absent consumers
	log *slog.Logger
	// own are the worker's own projections: it consumes their subscriptions itself, retired
	// or not, until it stops (a worker given both versions).
	own []string

	mu      sync.Mutex
	checked map[string]bool     // projections whose version was looked at since the start
	pending map[string]struct{} // retired units still to undeclare
	tried   time.Time           // the last try that left some pending
}

func newRetiredSubscriptions(ch channel.Channel, own []string, log *slog.Logger) *retiredSubscriptions {
	u, _ := ch.(channel.Undeclarer)
	return &retiredSubscriptions{ch: u, log: log, own: own, checked: map[string]bool{}, pending: map[string]struct{}{}}
}

// afterCatchUp is called after each catch-up of the projection called name that res sums up.
func (rs *retiredSubscriptions) afterCatchUp(ctx context.Context, runner *projection.Runner, name string, res projection.Result) {
	if rs.ch == nil {
		return
	}
	p, err := runner.Projection(name)
	if err != nil || p.Version() <= 1 {
		return // a partition's catch-up (its projection's own runs too), or no older version
	}
	rs.mu.Lock()
	check := !rs.checked[name] && !res.Activated
	rs.checked[name] = true
	rs.mu.Unlock()
	if check {
		// Once: a building version is cut over by a catch-up of one of its workers
		// (res.Activated there), and an active one stays active until a newer version's.
		st, err := runner.Status(ctx, name)
		if err != nil {
			rs.mu.Lock()
			rs.checked[name] = false // look again
			rs.mu.Unlock()
			return
		}
		if st.VersionState != projection.VersionActive {
			return
		}
	}
	if res.Activated || check {
		rs.retire(p)
		rs.try(ctx, true)
		return
	}
	rs.try(ctx, false)
}

// retire notes the subscriptions of the versions before p's as to undeclare.
func (rs *retiredSubscriptions) retire(p *projection.Projection) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for v := 1; v < p.Version(); v++ {
		if unit, err := projection.UnitName(p.Base(), v); err == nil && !slices.Contains(rs.own, unit) {
			rs.pending[unit] = struct{}{}
		}
	}
}

// try undeclares the pending subscriptions, now or, unless now is set, when
// retiredRetryInterval has passed since the last try that left some pending.
func (rs *retiredSubscriptions) try(ctx context.Context, now bool) {
	rs.mu.Lock()
	if len(rs.pending) == 0 || (!now && time.Since(rs.tried) < retiredRetryInterval) {
		rs.mu.Unlock()
		return
	}
	units := make([]string, 0, len(rs.pending))
	for unit := range rs.pending {
		units = append(units, unit)
	}
	rs.tried = time.Now()
	rs.mu.Unlock()

	for _, unit := range units {
		uctx, cancel := context.WithTimeout(ctx, retiredTimeout)
		err := rs.ch.Undeclare(uctx, unit)
		cancel()
		switch {
		case err == nil:
			rs.mu.Lock()
			delete(rs.pending, unit)
			rs.mu.Unlock()
			rs.log.InfoContext(ctx, "retired version's subscription undeclared: no trigger is kept for it any more", slog.String("retired", unit))
		case ctx.Err() != nil:
		case errors.Is(err, channel.ErrInUse):
			rs.log.DebugContext(ctx, "retired version's subscription kept while a worker of that version consumes it; trying again later",
				slog.String("retired", unit), slog.Any("error", err))
		default:
			rs.log.WarnContext(ctx, "could not undeclare a retired version's subscription; trying again later",
				slog.String("retired", unit), slog.Any("error", err))
		}
	}
}
