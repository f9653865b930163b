package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
)

// parkScenario: a poison stream under SIGKILLs and load, with the exactly-once projection in
// park mode.
func parkScenario() scenario {
	return scenario{
		name: "park",
		injects: "chaos_exact with OnFailure park (after 3 failures): an event it fails on until a control row fixes it, " +
			"later events of its stream appended meanwhile, and SIGKILLs of the workers (restarted at once) under load; " +
			"then the fix and `nudge parked redrive chaos_exact`",
		checks: "the stream parks with its later events held; once the writers stop and the projections caught up, no event " +
			"outside the parked stream is missing and none of it is applied; after the redrive every event is in every " +
			"read model, none twice in the exactly-once one, the poison event applied once, no parked stream left",
		settings: scenarioSettings{safetyNet: safetyNetDefault, park: true},
		run:      runPark,
		after:    checkPark,
	}
}

// parkKills is how many SIGKILLs the park scenario injects while its stream is parked.
const parkKills = 10

func runPark(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	poison, err := e.load.appendPoison(ctx)
	if err != nil {
		return err
	}
	stream := fmt.Sprintf("chaos-w%d-s0", e.load.writers) // appendPoison's stream
	e.poisonID, e.poisonAt = poison, time.Now()
	e.s.progress(e.name, "poison event %s appended to %s", poison, stream)
	var held []uuid.UUID
	for i := range parkKills {
		if err := backoff.Sleep(ctx, e.between(300*time.Millisecond, 900*time.Millisecond)); err != nil {
			return err
		}
		id, err := e.load.appendTo(ctx, stream, 1_000_000+i)
		if err != nil {
			return err
		}
		held = append(held, id)
		s := e.workers.slots[e.rng.IntN(len(e.workers.slots))]
		if s.kill() {
			r.Faults++
		}
		if _, err := s.start(); err != nil {
			r.addCheck("restart", false, "%v", err)
		}
	}
	r.FaultKind = "SIGKILLs, poison stream"
	e.load.stopWriters()
	if err := e.waitCaughtUp(ctx, catchUpTimeout); err != nil {
		r.addCheck("caught up while parked", false, "%v", err)
	}
	if err := checkWhileParked(ctx, e, r, stream, append([]uuid.UUID{poison}, held...)); err != nil {
		return err
	}

	// The fix, then the operator's redrive through the CLI.
	e.fixedAt = time.Now()
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+chaosmodel.ControlTable+` (key) VALUES ($1)`, chaosmodel.PoisonFixedKey); err != nil {
		return err
	}
	out, code, err := e.s.runCLI(ctx, e, "park-redrive", []string{"parked", "redrive", chaosmodel.ExactProjection, "--by", "chaos", "--wait", "60s"}, nil)
	if err != nil {
		return err
	}
	// A worker restarted by the kills above may redrive the stream first, once the fix is in
	// (its start-up redrive): the CLI then finds nothing parked and says who redrove it.
	redriven := strings.Contains(out, "no parked streams left") ||
		strings.Contains(out, "nothing to redrive") && strings.Contains(out, "redriven by")
	r.addCheck("nudge parked redrive", code == 0 && redriven, "exit %d: %s", code, strings.TrimSpace(out))
	e.faultsOver()
	return nil
}

// checkWhileParked checks, with the writers stopped and the projections caught up, that the
// stream is parked with its later events held, that no event outside it is missing from the
// exactly-once model and that none of the stream's is applied.
func checkWhileParked(ctx context.Context, e *env, r *result, stream string, streamIDs []uuid.UUID) error {
	var heldEvents int64
	err := e.pool.QueryRow(ctx, `SELECT held_events FROM nudge_projection_parked WHERE projection = $1 AND stream_id = $2`,
		chaosmodel.ExactProjection, stream).Scan(&heldEvents)
	r.addCheck("parked with its later events held", err == nil && heldEvents == int64(len(streamIDs)-1),
		"held %d of %d later events (%v)", heldEvents, len(streamIDs)-1, err)
	e.load.mu.Lock()
	acked := append([]uuid.UUID(nil), e.load.acked...)
	e.load.mu.Unlock()
	inStream := make(map[uuid.UUID]bool, len(streamIDs))
	for _, id := range streamIDs {
		inStream[id] = true
	}
	var outside []uuid.UUID
	for _, id := range acked {
		if !inStream[id] {
			outside = append(outside, id)
		}
	}
	missing, err := countMissing(ctx, e, outside)
	if err != nil {
		return err
	}
	r.addCheck("0 missing outside the parked stream", missing == 0, "%d of %d events missing from %s", missing, len(outside), chaosmodel.ExactProjection)
	parkedMissing, err := countMissing(ctx, e, streamIDs)
	if err != nil {
		return err
	}
	r.addCheck("none of the parked stream applied", parkedMissing == len(streamIDs), "%d of its %d events applied",
		len(streamIDs)-parkedMissing, len(streamIDs))
	r.Notes = append(r.Notes, fmt.Sprintf("while parked: %d events outside the stream, %d missing; %d of the stream held", len(outside), missing, heldEvents))
	return nil
}

// countMissing counts the ids the exactly-once model does not hold.
func countMissing(ctx context.Context, e *env, ids []uuid.UUID) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) AS a(id)
		WHERE NOT EXISTS (SELECT 1 FROM `+chaosmodel.ExactProjection+` x WHERE x.event_id = a.id)`, ids).Scan(&n)
	return n, err
}

// appendTo appends one event to stream (as the poison writer, with sequence seq), retrying
// until it is committed, and records it as acknowledged.
func (l *load) appendTo(ctx context.Context, stream string, seq int) (uuid.UUID, error) {
	payload, err := json.Marshal(chaosmodel.Payload{Writer: l.writers, Seq: seq})
	if err != nil {
		return uuid.Nil, err
	}
	id := uuid.Must(uuid.NewV7())
	data := eventstore.EventData{ID: id, Type: chaosmodel.EventType, Payload: payload}
	for {
		_, err := l.store.Append(ctx, stream, eventstore.Any, data)
		if err == nil {
			l.mu.Lock()
			l.acked = append(l.acked, id)
			l.mu.Unlock()
			return id, nil
		}
		if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
			return uuid.Nil, err
		}
	}
}

// checkPark: after the redrive and the verification of every read model.
func checkPark(ctx context.Context, e *env, r *result) error {
	var parked, redrives int
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM nudge_projection_parked),
		(SELECT count(*) FROM nudge_projection_park_actions WHERE action = 'redrive')`).Scan(&parked, &redrives); err != nil {
		return err
	}
	r.addCheck("no parked stream left", parked == 0 && redrives >= 1, "%d parked, %d redrive(s) recorded", parked, redrives)
	exact := e.verified.seen[chaosmodel.ExactProjection][e.poisonID]
	r.addCheck("the poison event is applied once after the redrive", exact.Count == 1, "applied %d time(s)", exact.Count)
	return nil
}
