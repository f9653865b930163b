package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nudgeworks/nudge"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/projection"
)

// deadLettersShown bounds the dead letters listed per projection in GET /status.
const deadLettersShown = 20

// statusJSON is what GET /status returns.
type statusJSON struct {
	// Mode and Channel are this process's.
	Mode    Mode        `json:"mode"`
	Channel ChannelKind `json:"channel"`
	// CaughtUp is true when every projection runs and has handled every committed event
	// (a retired version, which a newer one replaced, is done), and the relay (if any) has
	// published every trigger.
	CaughtUp    bool             `json:"caught_up"`
	Projections []projectionJSON `json:"projections"`
	// Relay is the progress of the trigger relay, which the workers run (read from the
	// database, in every process that serves HTTP).
	Relay *relayJSON `json:"relay,omitempty"`
}

// projectionJSON is one projection's status.
type projectionJSON struct {
	Name  string           `json:"name"`
	State projection.State `json:"state"`
	// Version is the version this process runs (ticket_list.v2 is version 2 of
	// ticket_list); VersionState is where it stands: active (readers see it), building
	// (beside the active version, until it cuts over) or retired; ActiveVersion is the
	// version readers see.
	Version       int                     `json:"version"`
	VersionState  projection.VersionState `json:"version_state,omitempty"`
	ActiveVersion int                     `json:"active_version,omitempty"`
	// CaughtUp: running, and every committed event handled (none readable left, none held
	// back by an open transaction).
	CaughtUp bool `json:"caught_up"`
	// Position is the last committed event's position; Head the newest readable one.
	Position        string  `json:"position"`
	Head            string  `json:"head"`
	EventsProcessed int64   `json:"events_processed"`
	LagEvents       int64   `json:"lag_events"`
	LagSeconds      float64 `json:"lag_seconds"`
	// HeldByHorizon: events are committed but an older open transaction keeps them unreadable;
	// the projection waits for it.
	HeldByHorizon bool `json:"held_by_horizon,omitempty"`
	// OldestOpenTransactionSeconds is the age of the transaction that holds it back, when
	// known.
	OldestOpenTransactionSeconds float64 `json:"oldest_open_transaction_seconds,omitempty"`
	// HeldBy names that transaction: session, database, user, age, what it waits on.
	HeldBy       string            `json:"held_by,omitempty"`
	LastError    string            `json:"last_error,omitempty"`
	FailingEvent *failingEventJSON `json:"failing_event,omitempty"`
	Attempts     int               `json:"attempts,omitempty"`
	// DeadLetters are the projection's failed dead letters (up to 20), oldest first.
	DeadLetters   []deadLetterJSON `json:"dead_letters"`
	UpdatedAt     time.Time        `json:"updated_at"`
	LastFailureAt *time.Time       `json:"last_failure_at,omitempty"`
}

type failingEventJSON struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	StreamID string `json:"stream_id"`
	Position string `json:"position"`
}

// deadLetterJSON is a failed dead letter: a trigger the projection gave up on.
type deadLetterJSON struct {
	ID            int64     `json:"id"`
	Error         string    `json:"error"`
	EventID       string    `json:"event_id,omitempty"`
	EventType     string    `json:"event_type,omitempty"`
	Count         int       `json:"count"`
	Attempts      int       `json:"attempts"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	LastFailedAt  time.Time `json:"last_failed_at"`
}

type relayJSON struct {
	Name       string           `json:"name"`
	State      projection.State `json:"state"`
	Position   string           `json:"position"`
	LagEvents  int64            `json:"lag_events"`
	LagSeconds float64          `json:"lag_seconds"`
	LastError  string           `json:"last_error,omitempty"`
}

// status reads every projection's status and failed dead letters.
func (s *service) status(ctx context.Context) (statusJSON, error) {
	out := statusJSON{Mode: s.cfg.Mode, Channel: s.cfg.Channel, CaughtUp: true}
	statuses, err := s.client.Statuses(ctx)
	if err != nil {
		return statusJSON{}, err
	}
	for _, st := range statuses {
		p := projectionJSON{
			Name: st.Name, State: st.State, Version: st.Version, VersionState: st.VersionState, ActiveVersion: st.ActiveVersion,
			Position: st.Position.String(), Head: st.Head.String(),
			EventsProcessed: st.EventsProcessed, LagEvents: st.LagEvents, LagSeconds: st.LagTime.Seconds(),
			HeldByHorizon: st.HeldByHorizon, LastError: st.LastError, Attempts: st.Attempts, UpdatedAt: st.UpdatedAt,
			DeadLetters: []deadLetterJSON{},
		}
		if st.Holder != nil {
			p.OldestOpenTransactionSeconds = st.Holder.Age.Seconds()
			p.HeldBy = st.Holder.String()
		}
		if !st.LastFailureAt.IsZero() {
			at := st.LastFailureAt
			p.LastFailureAt = &at
		}
		if fe := st.FailingEvent; fe != nil {
			p.FailingEvent = &failingEventJSON{ID: fe.ID.String(), Type: fe.Type, StreamID: fe.StreamID, Position: fe.Position.String()}
		}
		records, err := s.client.DeadLetters().List(ctx, deadletter.Filter{Projection: st.Name, Status: []deadletter.Status{deadletter.StatusFailed}, Limit: deadLettersShown})
		if err != nil {
			return statusJSON{}, fmt.Errorf("list the dead letters of %s: %w", st.Name, err)
		}
		for _, rec := range records {
			d := deadLetterJSON{ID: rec.ID, Error: rec.Error, Count: rec.Count, Attempts: rec.Attempts,
				FirstFailedAt: rec.FirstFailedAt, LastFailedAt: rec.LastFailedAt}
			if fe := rec.FailingEvent; fe != nil {
				d.EventID, d.EventType = fe.ID.String(), fe.Type
			}
			p.DeadLetters = append(p.DeadLetters, d)
		}
		// Events an open transaction elsewhere still hides are not done either.
		p.CaughtUp = st.Condition() == projection.ConditionCaughtUp
		out.CaughtUp = out.CaughtUp && (p.CaughtUp || st.Condition() == projection.ConditionRetired)
		out.Projections = append(out.Projections, p)
	}
	st, err := s.client.RelayStatus(ctx)
	if errors.Is(err, nudge.ErrNotSupported) {
		return out, nil // triggers published in the append's transaction: no relay to wait for
	}
	if err == nil {
		out.Relay = &relayJSON{Name: st.Name, State: st.State, Position: st.Position.String(),
			LagEvents: st.LagEvents, LagSeconds: st.LagTime.Seconds(), LastError: st.LastError}
	} // else the relay has not registered yet: no worker has started
	// Projections can finish an event's catch-up before the relay, which published its
	// trigger first, commits its own position: the relay must be caught up too.
	out.CaughtUp = out.CaughtUp && err == nil && st.CaughtUp()
	return out, nil
}
