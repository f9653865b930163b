package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// stallCheck is one projection's stall detection in the safety net (Config.StallAfter).
type stallCheck struct {
	since    time.Time           // the last check (or the start)
	position eventstore.Position // the position the last check saw
	checked  bool                // a check has run (the first tick only looks)
	reported bool                // the current stall was reported
}

// check runs at each safety-net tick, before its catch-up. The projection has stalled when it
// has readable events at least StallAfter old and either no trigger started a catch-up since the
// last tick (its triggers are lost: the safety net's catch-up that follows makes up for them), or
// a catch-up has run for StallAfter while its position did not move (it is stuck). A projection
// that triggers keep busy with a large backlog has not stalled.
// st is the projection's status read for the tick, or err why it could not be read.
func (s *stallCheck) check(ctx context.Context, w *Worker, name string, st projection.Status, err error, log *slog.Logger) {
	if err != nil {
		return // the catch-up that follows reports what is wrong
	}
	now, c := time.Now(), w.stats[name]
	last, moved, first := s.since, st.Position != s.position, !s.checked
	s.since, s.position, s.checked = now, st.Position, true
	k := st.Condition()
	if first || (k != projection.ConditionWorking && k != projection.ConditionRebuilding) || st.LagTime < w.cfg.StallAfter {
		s.reported = false
		return
	}
	var cause string
	switch {
	case c.running.Load() > 0 && !moved && now.Sub(time.Unix(0, c.runningSince.Load())) >= w.cfg.StallAfter:
		cause = "a catch-up has been running for " + now.Sub(time.Unix(0, c.runningSince.Load())).Round(time.Millisecond).String() +
			" without moving the position (stuck?)"
	case c.triggered.Load() < last.UnixNano():
		cause = "no trigger started a catch-up since the last safety-net tick (triggers lost?); the safety net catches up now"
	default:
		s.reported = false
		return
	}
	if s.reported {
		return
	}
	s.reported = true
	c.stalls.Add(1)
	log.WarnContext(ctx, "projection stalled: readable events wait", slog.String("cause", cause),
		slog.Int64("lag_events", st.LagEvents), slog.Duration("lag", st.LagTime), slog.String("position", st.Position.String()))
}
