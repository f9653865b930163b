package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
)

// HorizonHolder returns the open transaction that keeps committed events of the store
// unreadable, or nil when no committed event waits. It names the transaction's session from
// pg_stat_activity, in any database of the cluster (a transaction of another database holds the
// horizon only while it shows no lock there: it has only taken an id); without the privilege to see other users'
// sessions (pg_read_all_stats) it gives the transaction id and the reason (Hidden).
func (s *Store) HorizonHolder(ctx context.Context) (*eventstore.HorizonHolder, error) {
	var (
		h                  eventstore.HorizonHolder
		pid                *int32
		started            *time.Time
		writes, privileged *bool
		age                int32
		user               string
	)
	err := s.db.QueryRow(ctx, s.sql.holder).Scan(&h.TransactionID, &h.HeldEvents, &age, &pid, &h.Database, &h.User,
		&h.ApplicationName, &h.ClientAddr, &started, &h.State, &h.WaitEvent, &h.PreparedGID, &writes, &privileged, &user)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, s.translate(err)
	}
	h.TransactionsSince = int64(age)
	if h.HeldEvents > eventstore.HeldEventsLimit {
		h.HeldEvents, h.HeldEventsMore = eventstore.HeldEventsLimit, true
	}
	if pid != nil {
		h.PID = int(*pid)
	}
	if started != nil {
		h.Started = *started
		h.Age = time.Since(*started)
	}
	if writes != nil {
		h.WritesEvents, h.WritesEventsKnown = *writes, true
	}
	unprivileged := privileged != nil && !*privileged
	switch {
	case h.PreparedGID != "" || (pid != nil && started != nil):
	case pid != nil && unprivileged:
		h.Hidden = "the server shows another user's transaction start, state and client only to members of pg_read_all_stats: GRANT pg_read_all_stats TO " + user
	case unprivileged:
		h.Hidden = "the server shows other users' sessions only to members of pg_read_all_stats: GRANT pg_read_all_stats TO " + user
	default:
		h.Hidden = "no session has this transaction any more: it has just ended"
	}
	return &h, nil
}
