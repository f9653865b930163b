package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/projection"
)

// The rebuild-kill scenario's sizes.
const (
	// rebuildBacklog is appended before the workers start: history for version 2 to build.
	rebuildBacklog = 6000
	// rebuildBuildKills is how many kills the build gets at most (at random moments); the
	// rest of it runs undisturbed until the cut-over.
	rebuildBuildKills = 6
	// rebuildMinBuildKills is how many of them must land while version 2 is building with
	// committed progress and still behind. How many do depends on how fast the build runs
	// against the kills' random moments (CI once saw 1 of 6); the kill points of a build are
	// proven one by one by projection/postgres's TestVersionBuildSurvivesSIGKILL.
	rebuildMinBuildKills = 1
	// rebuildFlipKills is how many cut-overs are killed inside their ActivateFunc before one
	// is let through.
	rebuildFlipKills = 2
	// rebuildFlipHold is how long version 2's cut-over waits in its ActivateFunc: the window
	// for a kill inside the flip.
	rebuildFlipHold = time.Second
	// rebuildLiveKills are the kills after the flip, with version 2 active.
	rebuildLiveKills = 2
	// rebuildWait bounds each wait for the build or the flip (before timeoutScale).
	rebuildWait = 60 * time.Second

	// repartitionFrom and repartitionTo are the repartition scenario's partition counts of
	// versions 1 and 2.
	repartitionFrom, repartitionTo = 4, 8
	// repartitionLeaseTTL and repartitionLeaseRenew are its workers' lease times: a SIGKILLed
	// worker's partitions wait for its leases to lapse before the next owner (its own restart
	// too, a new owner) claims them, up to TTL + renewal: 2.5 s here, 7.5 s with the defaults
	// (6 s, 1.5 s), which would stretch the run well past a minute.
	repartitionLeaseTTL, repartitionLeaseRenew = 2 * time.Second, 500 * time.Millisecond
)

// rebuildScenario: a rolling deploy of version 2 of the exactly-once projection under load,
// with SIGKILLs during its build and inside its cut-over.
func rebuildScenario() scenario {
	return scenario{
		name: "rebuild-kill",
		injects: fmt.Sprintf("chaos_exact as a versioned projection (a table per version behind the view chaos_exact), both workers at "+
			"version 1 over a %d-event backlog and live load; a rolling deploy: worker-1 killed and restarted at version 2, "+
			"which builds beside version 1 while random workers are SIGKILLed (up to %d kills, restarted at once); version 2's "+
			"cut-over waits %s in its ActivateFunc, and the first %d cut-overs are killed there (the first time with the "+
			"version 1 worker too); then worker-2 is replaced at version 2 and %d more kills follow",
			rebuildBacklog, rebuildBuildKills, rebuildFlipHold, rebuildFlipKills, rebuildLiveKills),
		checks: "at least one kill lands while version 2 is building with committed progress and behind; at least one kill aimed " +
			"at the flip lands inside its ActivateFunc, and each that does leaves version 1 active; version 2 is active at the end and the view is its table, with every event exactly " +
			"once and in stream order (the usual checks on chaos_exact); version 1 is retired and its table holds every event " +
			"up to its last position exactly once and in order, none after it (exact_v1)",
		// Unpaced: under the live load the default pacing gives the build a few percent of
		// the time, and every kill starts its pacer anew (the bound it had lowered while not
		// gaining back at 32× the batch), so a build of the backlog outlasted rebuildWait;
		// what the scenario checks (the build and its cut-over survive the kills) does not
		// depend on the waits between batches, which `make bench` measures. repartition
		// keeps the default.
		settings: scenarioSettings{safetyNet: safetyNetDefault, rebuild: true, flipHold: rebuildFlipHold, buildLagTarget: -1},
		run:      runRebuildKill,
		after:    checkRebuildKill,
	}
}

// repartitionScenario: rebuild-kill's rolling deploy and kills, with chaos_exact partitioned
// and its new version changing the partition count.
func repartitionScenario() scenario {
	return scenario{
		name: "repartition",
		injects: fmt.Sprintf("chaos_exact (the only projection here) as a versioned, partitioned projection: version 1 in %d partitions, "+
			"both workers at version 1 sharing its leases (TTL %s, renewal %s) over a %d-event backlog and live load; a rolling deploy "+
			"of version 2 in %d partitions: worker-1 killed and restarted at version 2, whose partitions (chaos_exact.v2.p0 … p%d) "+
			"build beside version 1 on leases of their own while random workers are SIGKILLed (up to %d kills, restarted at once); "+
			"version 2's cut-over (one transaction over all %d units of both versions) waits %s in its ActivateFunc, and the first "+
			"%d cut-overs are killed there (the first time with the version 1 worker too); then worker-2 is replaced at version 2 "+
			"and %d more kills follow",
			repartitionFrom, repartitionLeaseTTL, repartitionLeaseRenew, rebuildBacklog, repartitionTo, repartitionTo-1,
			rebuildBuildKills, repartitionFrom+repartitionTo, rebuildFlipHold, rebuildFlipKills, rebuildLiveKills),
		checks: "rebuild-kill's: at least one kill lands while version 2 is building with committed progress and behind; at least " +
			"one kill aimed at the flip lands inside its ActivateFunc, and each that does leaves version 1 active; version 2 is " +
			"active at the end with its " + fmt.Sprint(repartitionTo) + " partitions, the view is its table, with every event exactly once and in stream " +
			"order; version 1 is retired with its " + fmt.Sprint(repartitionFrom) + " partitions, and its table holds, per partition, every event of " +
			"the partition's streams up to the partition's last position exactly once and in order, none after it (exact_v1)",
		settings: scenarioSettings{safetyNet: safetyNetDefault, rebuild: true, flipHold: rebuildFlipHold,
			partitions: repartitionFrom, nextPartitions: repartitionTo, exactOnly: true,
			leaseTTL: repartitionLeaseTTL, leaseRenew: repartitionLeaseRenew},
		run:   runRebuildKill,
		after: checkRebuildKill,
	}
}

// runRebuildKill runs the rolling deploy of rebuild-kill and repartition (which differ in
// their settings: the partitions of each version).
func runRebuildKill(ctx context.Context, e *env, r *result) error {
	if err := e.load.backlog(ctx, rebuildBacklog); err != nil {
		return err
	}
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, time.Second); err != nil {
		return err
	}
	// The rolling deploy: worker-1 comes back at version 2, worker-2 runs version 1 on.
	neu, old := e.workers.slots[0], e.workers.slots[1]
	neu.deploy(2, e.settings.partitionsOf(2))
	e.killAndRestart(r, neu)
	e.s.progress(e.name, "worker-1 restarted at version 2; killing workers during its build")
	built := time.Now()
	inBuild, err := e.killDuringBuild(ctx, r, neu)
	if err != nil {
		return err
	}
	r.addCheck("kills during the build", inBuild >= rebuildMinBuildKills, "%d kills while version 2 was building, behind, with committed progress", inBuild)
	flipped, err := e.killInsideFlips(ctx, r, neu, old)
	if err != nil {
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("version 2 built and cut over %s after its first worker started (%d kills during the build)",
		flipped.Sub(built).Round(100*time.Millisecond), inBuild))

	// The rest of the rolling deploy, and kills with version 2 active.
	old.deploy(2, e.settings.partitionsOf(2))
	e.killAndRestart(r, old)
	for range rebuildLiveKills {
		if err := backoff.Sleep(ctx, e.between(300*time.Millisecond, 900*time.Millisecond)); err != nil {
			return err
		}
		e.killAndRestart(r, e.workers.slots[e.rng.IntN(len(e.workers.slots))])
	}
	r.FaultKind = "SIGKILLs, rolling deploy of version 2"
	if from, to := e.settings.partitionsOf(1), e.settings.partitionsOf(2); from > 1 || to > 1 {
		r.FaultKind += fmt.Sprintf(" (%d → %d partitions)", max(from, 1), max(to, 1))
	}
	e.faultsOver()
	return backoff.Sleep(ctx, 2*time.Second)
}

// killAndRestart SIGKILLs the slot's worker, counting the kill, and starts it again at once.
func (e *env) killAndRestart(r *result, s *workerSlot) {
	if s.kill() {
		r.Faults++
	}
	if _, err := s.start(); err != nil {
		r.addCheck("restart", false, "%v", err)
	}
}

// killDuringBuild kills a random worker up to rebuildBuildKills times while version 2 builds,
// then waits until neu's worker is inside its cut-over. Each kill waits for its event: the
// build observed in progress, with committed progress since the previous kill (its events
// processed grew) and still behind; then a random 0–300 ms more, so the kills land at various
// points of a batch. A kill at a fixed pace could land each time before a restarted worker
// had committed anything on a loaded machine (none of six did once). It returns how many
// kills landed while version 2 was building, behind, with committed progress.
func (e *env) killDuringBuild(ctx context.Context, r *result, neu *workerSlot) (int, error) {
	inBuild, processed := 0, int64(0)
	for kills := 0; kills < rebuildBuildKills; kills++ {
		st, building, err := e.awaitBuildProgress(ctx, neu, processed)
		if err != nil || !building {
			return inBuild, err
		}
		processed = st.EventsProcessed
		select {
		case <-neu.current().flipping:
			return inBuild, nil
		case <-time.After(e.between(0, 300*time.Millisecond)):
		case <-ctx.Done():
			return inBuild, ctx.Err()
		}
		if st, err = e.status.Status(ctx, chaosmodel.ExactUnit(2)); err != nil {
			return inBuild, err
		}
		if st.VersionState != projection.VersionBuilding {
			return inBuild, fmt.Errorf("version 2 is %s before its cut-over was seen", st.VersionState)
		}
		if st.EventsProcessed > 0 && st.LagEvents > 0 {
			inBuild++
		}
		e.killAndRestart(r, e.workers.slots[e.rng.IntN(len(e.workers.slots))])
	}
	return inBuild, nil
}

// awaitBuildProgress waits, up to rebuildWait (scaled), until version 2 is building with more
// than processed events processed and still behind; it returns its status and true then, or
// false when neu's worker reached its cut-over first or the build is level (the cut-over is
// next: a kill now would not be in the build).
func (e *env) awaitBuildProgress(ctx context.Context, neu *workerSlot, processed int64) (projection.Status, bool, error) {
	wait := deadline(rebuildWait)
	until := time.Now().Add(wait)
	for {
		select {
		case <-neu.current().flipping:
			return projection.Status{}, false, nil
		default:
		}
		st, err := e.status.Status(ctx, chaosmodel.ExactUnit(2))
		switch {
		case err != nil:
			return st, false, err
		case st.VersionState == projection.VersionBuilding && st.EventsProcessed > processed && st.LagEvents > 0:
			return st, true, nil
		case st.VersionState == projection.VersionBuilding && st.EventsProcessed > 0 && st.LagEvents == 0:
			return st, false, nil
		case time.Now().After(until):
			return st, false, fmt.Errorf("version 2 made no progress in its build within %s (state %q, %d events processed, %d behind)",
				wait, st.VersionState, st.EventsProcessed, st.LagEvents)
		}
		if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
			return st, false, err
		}
	}
}

// killInsideFlips kills neu's worker inside its cut-over's ActivateFunc (the view replaced,
// nothing committed) rebuildFlipKills times, the first time together with old's worker (version
// 1's, its batches waiting for the flip's lock), checking that version 1 stays active; then it
// lets the cut-over through and returns when version 2 became active.
func (e *env) killInsideFlips(ctx context.Context, r *result, neu, old *workerSlot) (time.Time, error) {
	var (
		inside, aimed int
		firstHold     time.Time
	)
	for active := 1; aimed < rebuildFlipKills && active == 1; aimed++ {
		proc := neu.current()
		select {
		case <-proc.flipping:
		case <-time.After(deadline(rebuildWait)):
			return time.Time{}, fmt.Errorf("version 2's worker did not reach its cut-over within %s (cut-over %d; %s; %s)",
				deadline(rebuildWait), aimed+1, e.versionLag(ctx, 2), e.versionLag(ctx, 1))
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
		restart := []*workerSlot{neu}
		if aimed == 0 {
			firstHold = time.Now()
			if old.kill() {
				r.Faults++
				restart = append(restart, old)
			}
		}
		held := proc.inFlip.Load() // the kill lands before the hook ends, so before the commit
		if neu.kill() {
			r.Faults++
		}
		var err error
		if active, err = e.activeVersion(ctx); err != nil {
			return time.Time{}, err
		}
		if held {
			inside++
			r.addCheck(fmt.Sprintf("kill %d inside the flip leaves version 1 active", aimed+1), active == 1, "active version after the kill: %d", active)
		}
		for _, s := range restart {
			if _, err := s.start(); err != nil {
				r.addCheck("restart", false, "%v", err)
			}
		}
	}
	r.addCheck("kills inside the flip", inside > 0, "%d of %d kills aimed at the cut-over landed inside its ActivateFunc", inside, aimed)
	e.s.progress(e.name, "%d kills inside the cut-over; letting the next one through", inside)
	if err := e.awaitActive(ctx, 2); err != nil {
		return time.Time{}, err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d of %d kills aimed at the cut-over landed inside it (ActivateFunc held %s); "+
		"version 2 became active %s after the first cut-over began", inside, aimed, rebuildFlipHold,
		time.Since(firstHold).Round(100*time.Millisecond)))
	return time.Now(), nil
}

// versionLag describes the state and lag of version of the exactly-once projection, each
// partition's too: what a cut-over that does not come waits for (version 2's build, or
// version 1's own lag, which version 2 claims past only while version 1's lock is free).
func (e *env) versionLag(ctx context.Context, version int) string {
	st, err := e.status.Status(ctx, chaosmodel.ExactUnit(version))
	if err != nil {
		return fmt.Sprintf("status: %v", err)
	}
	text := fmt.Sprintf("version %d %s, %d events processed, %d behind", version, st.VersionState, st.EventsProcessed, st.LagEvents)
	var parts []string
	for _, part := range st.Partitions {
		parts = append(parts, fmt.Sprintf("%s %d behind", part.Name, part.LagEvents))
	}
	if len(parts) > 0 {
		text += " (" + strings.Join(parts, ", ") + ")"
	}
	return text
}

// awaitActive waits up to rebuildWait (scaled) until version is the exactly-once projection's active
// version.
func (e *env) awaitActive(ctx context.Context, version int) error {
	wait := deadline(rebuildWait)
	until := time.Now().Add(wait)
	for {
		active, err := e.activeVersion(ctx)
		if err != nil || active == version {
			return err
		}
		if time.Now().After(until) {
			return fmt.Errorf("version %d not active within %s (active: %d)", version, wait, active)
		}
		if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// activeVersion is the exactly-once projection's active version.
func (e *env) activeVersion(ctx context.Context) (int, error) {
	var v int
	err := e.pool.QueryRow(ctx, `SELECT version FROM nudge_projection_versions WHERE projection = $1 AND state = 'active'`,
		chaosmodel.ExactProjection).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// checkRebuildKill: version 2 active and behind the view, version 1 retired with a complete
// model up to its last position (each partition's, when it is partitioned); each version has
// its partitions.
func checkRebuildKill(ctx context.Context, e *env, r *result) error {
	var v1, v2 string
	if err := e.pool.QueryRow(ctx, `SELECT
		(SELECT state FROM nudge_projection_versions WHERE projection = $1 AND version = 1),
		(SELECT state FROM nudge_projection_versions WHERE projection = $1 AND version = 2)`, chaosmodel.ExactProjection).Scan(&v1, &v2); err != nil {
		return err
	}
	r.addCheck("version 2 active, version 1 retired", v1 == string(projection.VersionRetired) && v2 == string(projection.VersionActive),
		"version 1 %s, version 2 %s", v1, v2)
	var viewOfV2 bool
	if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.view_table_usage
		WHERE view_name = $1 AND table_name = $2)`, chaosmodel.ExactProjection, chaosmodel.ExactTable(2)).Scan(&viewOfV2); err != nil {
		return err
	}
	r.addCheck("the view is version 2's table", viewOfV2, "%s reads %s: %t", chaosmodel.ExactProjection, chaosmodel.ExactTable(2), viewOfV2)

	st, err := e.status.Status(ctx, chaosmodel.ExactUnit(1))
	if err != nil {
		return err
	}
	if err := checkPartitions(ctx, e, r); err != nil {
		return err
	}
	upTo, contents, err := readAppendedHandled(ctx, e, st)
	if err != nil {
		return err
	}
	seen, err := readTable(ctx, e.pool, `SELECT event_id, times, projected_at, stream_id, version, writer, seq, applied FROM `+
		pgx.Identifier{chaosmodel.ExactTable(1)}.Sanitize())
	if err != nil {
		return err
	}
	m := compare(chaosmodel.ExactTable(1), true, upTo, seen)
	m.Mismatched, m.OutOfOrder = checkContent(contents, seen)
	r.Models = append(r.Models, m)
	stopped := st.Position.String()
	if len(st.Partitions) > 0 {
		var at []string
		for _, part := range st.Partitions {
			at = append(at, part.Position.String())
		}
		stopped = fmt.Sprintf("%s (its %d partitions)", strings.Join(at, ", "), len(st.Partitions))
	}
	r.Notes = append(r.Notes, fmt.Sprintf("version 1 stopped at %s with %d of the %d events in its table; version 2's cut-over and "+
		"its live batches handled the rest", stopped, m.Projected, r.Appended))
	return nil
}

// checkPartitions checks that both versions of the exactly-once projection run as the
// partitions the scenario gave them.
func checkPartitions(ctx context.Context, e *env, r *result) error {
	for version := 1; version <= 2; version++ {
		want := e.settings.partitionsOf(version)
		if want <= 1 {
			continue
		}
		st, err := e.status.Status(ctx, chaosmodel.ExactUnit(version))
		if err != nil {
			return err
		}
		var names []string
		ok := len(st.Partitions) == want
		for k, part := range st.Partitions {
			names = append(names, part.Name)
			ok = ok && part.PartitionOf == st.Name && part.Partition == eventstore.Partition{Index: k, Count: want}
		}
		r.addCheck(fmt.Sprintf("version %d runs as %d partitions", version, want), ok, "%s: %d partitions (%s)",
			st.Name, len(st.Partitions), strings.Join(names, ", "))
	}
	return nil
}

// readAppendedHandled reads the suite's events from the store, id → recorded time, of those
// the exactly-once projection's status st says it has handled: up to its position, or, when
// it is partitioned, each stream's events up to the position of the partition that holds it.
// It also returns id → content of every event.
func readAppendedHandled(ctx context.Context, e *env, st projection.Status) (map[uuid.UUID]time.Time, map[uuid.UUID]content, error) {
	all, contents, err := readAppended(ctx, e.store)
	if err != nil {
		return nil, nil, err
	}
	handled := handledBy(st)
	out := map[uuid.UUID]time.Time{}
	var after eventstore.Position
	for {
		events, err := e.store.Read(ctx, after, eventstore.ReadOptions{Limit: eventstore.ReadLimitMax, Types: []string{chaosmodel.EventType}})
		if err != nil {
			return nil, nil, fmt.Errorf("read the event store: %w", err)
		}
		if len(events) == 0 {
			return out, contents, nil
		}
		for _, ev := range events {
			if handled(ev) {
				out[ev.ID] = all[ev.ID]
			}
		}
		after = events[len(events)-1].Position
	}
}

// handledBy reports, for an event, whether a projection with status st has handled it: the
// event is at or before st's position, or, when st is partitioned, at or before the position
// of the partition that holds its stream.
func handledBy(st projection.Status) func(eventstore.Event) bool {
	if len(st.Partitions) == 0 {
		return func(ev eventstore.Event) bool { return !st.Position.Less(ev.Position) }
	}
	return func(ev eventstore.Event) bool {
		for _, part := range st.Partitions {
			if part.Partition.Contains(ev.StreamID) {
				return !part.Position.Less(ev.Position)
			}
		}
		return false
	}
}
