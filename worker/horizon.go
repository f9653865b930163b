package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
)

const (
	// HorizonPollIntervalDefault is how often Run looks up the transaction holding the store's
	// horizon (Config.Horizon).
	HorizonPollIntervalDefault = 2 * time.Second
	// HorizonWarnAfterDefault is how long a transaction may hold the horizon before Run logs a
	// warning naming it.
	HorizonWarnAfterDefault = 10 * time.Second
)

// HolderSource names the transaction holding an event store's readers back;
// *eventstore/postgres.Store is one.
type HolderSource interface {
	HorizonHolder(ctx context.Context) (*eventstore.HorizonHolder, error)
}

// watchHorizon polls the holder every interval until ctx ends. It logs one warning per holder
// once it has held readers back for warnAfter (its transaction's age when the server shows it,
// else the time since it was first seen), and an info line when a holder it warned about ends.
func (w *Worker) watchHorizon(ctx context.Context) {
	src := w.cfg.Horizon
	if src == nil || w.cfg.HorizonPollInterval < 0 {
		return
	}
	var (
		current  uint64 // the holder's transaction id, 0 when none
		since    time.Time
		warned   bool
		interval = w.cfg.HorizonPollInterval
	)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		h, err := src.HorizonHolder(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			w.logger.Warn("looking up the transaction that holds the event store's horizon failed", slog.Any("error", err))
		case h == nil:
			if warned {
				w.logger.Info("the transaction that held the event store's horizon has ended", slog.Uint64("xid", current))
			}
			current, warned = 0, false
		default:
			if h.TransactionID != current {
				current, since, warned = h.TransactionID, time.Now(), false
			}
			age := h.Age
			if h.Started.IsZero() {
				age = time.Since(since)
			}
			if !warned && age >= w.cfg.HorizonWarnAfter {
				warned = true
				w.logger.Warn("an open transaction holds every reader of the event store back: projections wait for it (they never skip); end it to let them go on",
					holderAttrs(h, age)...)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// holderAttrs are a holder's log attributes.
func holderAttrs(h *eventstore.HorizonHolder, age time.Duration) []any {
	attrs := []any{slog.Uint64("xid", h.TransactionID), slog.Duration("age", age),
		slog.Int64("held_events", h.HeldEvents), slog.String("holder", h.String())}
	if h.Hidden != "" {
		return append(attrs, slog.String("hidden", h.Hidden))
	}
	attrs = append(attrs, slog.Int("pid", h.PID), slog.String("database", h.Database), slog.String("user", h.User),
		slog.String("application_name", h.ApplicationName), slog.String("client_addr", h.ClientAddr),
		slog.String("state", h.State), slog.String("wait_event", h.WaitEvent))
	if h.WritesEventsKnown {
		attrs = append(attrs, slog.Bool("writes_events", h.WritesEvents))
	}
	return attrs
}
