package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
)

// scenario is one kind of fault, injected while writers append and workers project.
type scenario struct {
	name string
	// injects and checks describe the scenario for RELIABILITY.md and -list.
	injects, checks string
	settings        scenarioSettings
	// optIn leaves the scenario out of "all": it runs only when named.
	optIn bool
	// run starts the workers and the writers, injects the faults, calls e.faultsOver after
	// the last one and returns once the writers have stopped. It adds its own checks to r.
	run func(ctx context.Context, e *env, r *result) error
	// after, if set, adds checks once every projection has caught up and the workers stopped.
	after func(ctx context.Context, e *env, r *result) error
}

// catchUpTimeout bounds the wait for the projections after the faults (before timeoutScale).
const catchUpTimeout = 90 * time.Second

// runScenario runs sc in an environment of its own and verifies every read model.
func (s *suite) runScenario(ctx context.Context, sc scenario) *result {
	started := time.Now()
	r := &result{Scenario: sc.name, Recover: -1}
	defer func() { r.Took = time.Since(started); r.finish() }()
	fail := func(err error) *result {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", errBudget, err)
		}
		r.Error = err.Error()
		s.log.Error("scenario failed", slog.String("scenario", sc.name), slog.Any("error", err))
		return r
	}
	// Whatever a scenario did to the private cluster, the next one finds it running.
	defer func() {
		if err := s.cluster.EnsureRunning(context.WithoutCancel(ctx)); err != nil {
			s.log.Error("could not start the private PostgreSQL cluster again", slog.Any("error", err))
		}
	}()
	e, err := s.newEnv(ctx, sc.name, sc.settings)
	if err != nil {
		return fail(fmt.Errorf("set up: %w", err))
	}
	r.Logs = e.logDir
	defer e.close()
	if err := sc.run(ctx, e, r); err != nil {
		return fail(err)
	}
	e.load.stopWriters()
	r.Acked, r.AppendRetries = e.load.ackedCount(), e.load.retries.Load()
	s.progress(sc.name, "writers stopped after %d acknowledged events; waiting for the projections", r.Acked)
	if e.load.failed.Load() {
		r.addCheck("writers", false, "a writer stopped on an error; see runner.log")
	}
	caughtUp := e.waitCaughtUp(ctx, deadline(catchUpTimeout))
	e.workers.stopAll() // the file sinks are complete once the workers are gone
	if caughtUp != nil {
		r.addCheck("caught up", false, "%v", caughtUp)
	}
	// Only the suite ends workers: an exit of their own or a hang at shutdown fails the run.
	problems := e.workers.problems()
	if e.relayProc != nil {
		e.relayProc.stop(10 * time.Second)
		problems = errors.Join(problems, (&pool{slots: []*workerSlot{e.relayProc}}).problems())
	}
	r.addCheck("workers exit only when stopped, promptly", problems == nil, "%s", errText(problems))
	if err := s.verify(ctx, e, r); err != nil {
		return fail(fmt.Errorf("verify: %w", err))
	}
	if !e.faultEnd.IsZero() {
		r.Recover = e.recovery()
	}
	if sc.after != nil {
		if err := sc.after(ctx, e, r); err != nil {
			return fail(err)
		}
	}
	if err := s.summariseDeadLetters(ctx, e, r); err != nil {
		return fail(err)
	}
	if sc.settings.outage {
		// An outage is retried until it heals, never dead-lettered (docs/explanation/guarantees.md).
		r.addCheck("no dead letter after the outages", len(r.DeadLetters) == 0, "%d record(s)", len(r.DeadLetters))
	}
	return r
}

// errText is err's text, "none" for nil.
func errText(err error) string {
	if err == nil {
		return "none"
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// verify compares every read model with the event store.
func (s *suite) verify(ctx context.Context, e *env, r *result) error {
	appended, contents, err := readAppended(ctx, e.store)
	if err != nil {
		return err
	}
	r.Appended = len(appended)
	lost := 0
	for _, id := range e.load.ackedIDs() {
		if _, ok := appended[id]; !ok {
			lost++
		}
	}
	r.addCheck("acknowledged appends are in the store", lost == 0, "%d of %d missing from the store", lost, r.Acked)
	e.verified = verified{appended: appended, seen: map[string]map[uuid.UUID]sighting{}}
	for _, name := range e.settings.modelNames() {
		seen, torn, err := e.readModel(ctx, name)
		if err != nil {
			return err
		}
		m := compare(name, chaosmodel.IsExactlyOnce(name), appended, seen)
		m.Torn = torn
		m.Mismatched, m.OutOfOrder = checkContent(contents, seen)
		r.Models = append(r.Models, m)
		e.verified.seen[name] = seen
	}
	return nil
}

// readModel reads what the named read model holds, and the torn lines of the file model.
func (e *env) readModel(ctx context.Context, name string) (map[uuid.UUID]sighting, int, error) {
	switch name {
	case chaosmodel.ExactProjection:
		seen, err := readExact(ctx, e.pool)
		return seen, 0, err
	case chaosmodel.IdempotentProjection:
		seen, err := readIdempotent(ctx, e.pool)
		return seen, 0, err
	}
	if chaosmodel.IsExactlyOnce(name) { // a fleet projection: a table of its name
		seen, err := readTable(ctx, e.pool, `SELECT event_id, times, projected_at, stream_id, version, writer, seq, applied FROM `+name)
		return seen, 0, err
	}
	switch name {
	case chaosmodel.IdempotentProjection:
		seen, err := readIdempotent(ctx, e.pool)
		return seen, 0, err
	default:
		return readSinks(e.sinkDir)
	}
}

// summariseDeadLetters copies the scenario's dead letters into the result.
func (s *suite) summariseDeadLetters(ctx context.Context, e *env, r *result) error {
	recs, err := e.dead.List(ctx, deadletter.Filter{Limit: deadletter.ListLimitMax})
	if err != nil {
		return fmt.Errorf("list the dead letters: %w", err)
	}
	for _, rec := range recs {
		d := deadLetterSummary{ID: rec.ID, Projection: rec.Projection, Status: string(rec.Status), Count: rec.Count,
			MessageUUID: rec.MessageUUID, Error: cut(rec.Error, 300)}
		if rec.FailingEvent != nil {
			d.FailingID = rec.FailingEvent.ID.String()
		}
		r.DeadLetters = append(r.DeadLetters, d)
	}
	return nil
}

// cut shortens s to at most n bytes.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
