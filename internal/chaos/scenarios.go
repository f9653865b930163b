package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

// safetyNetDefault is the workers' safety-net interval in the scenarios that do not test it:
// long enough that triggers, not the tick, heal what the faults break.
const safetyNetDefault = 10 * time.Second

// scenarios lists every scenario, in the order "all" runs them (security last: it searches the
// outputs of the others).
func scenarios() []scenario {
	return []scenario{
		{
			name:     "sigkill",
			injects:  "SIGKILL of a random worker process at random moments (at least 20), during the catch-up of a backlog and then under live load; each killed worker is restarted at once",
			checks:   "every event in every read model, none twice in the exactly-once one; no worker exits by itself",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runSigkill,
		},
		{
			name:     "connection-cut",
			injects:  "RabbitMQ closes every connection of the workers and of the trigger publisher (rabbit_networking:close_connection through rabbitmqctl eval), four times, while appends continue",
			checks:   "every cut closes connections; every event in every read model through reconnected subscriptions; no dead letter",
			settings: scenarioSettings{safetyNet: safetyNetDefault, outage: true},
			run:      runConnectionCut,
		},
		{
			name:     "broker-restart",
			injects:  "a RabbitMQ node of the suite's own (private node name, ports and directories) stopped with rabbitmqctl stop, then killed with SIGKILL, and started again each time while triggers are in flight; the workers' safety net is off",
			checks:   "a durable queue bound to the trigger exchange keeps its persistent messages and its binding; the workers' consumers come back without a restart; every event in every read model; no dead letter",
			settings: scenarioSettings{safetyNet: -1, outage: true, privateBroker: true},
			run:      runBrokerRestart,
		},
		{
			name:     "relay-kill",
			injects:  "the relay, in a process of its own (chaosrelay), SIGKILLed 12 times under load (every 0.5–1.5 s, away 0.2–0.8 s before its restart); the workers' safety net is off",
			checks:   "every event in every read model, none twice in the exactly-once one; every event applied within the relay's longest absence (kill to ready) + 5 s",
			settings: scenarioSettings{safetyNet: -1, externalRelay: true},
			run:      runRelayKill,
			after:    checkRelayKill,
		},
		{
			name:     "postgres-restart",
			injects:  "fast shutdown and start of the (private) PostgreSQL cluster, three times, while workers run and writers append and retry",
			checks:   "every acknowledged append is in the store; every committed event in every read model, none twice in the exactly-once one; no dead letter",
			settings: scenarioSettings{safetyNet: safetyNetDefault, outage: true},
			run:      runPostgresRestart,
		},
		{
			name:     "postgres-crash",
			injects:  "crashes of the durable (fsync=on, full_page_writes=on) private cluster, pg_ctl stop -m immediate and start: during the catch-up of a backlog, under live load, and while a poison event's dead letter is being written",
			checks:   "every acknowledged append is in the store; every event in every read model, none twice in the exactly-once one; no dead letter but the poison event's, replayed after its fix",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runPostgresCrash,
			after:    checkPostgresCrash,
		},
		{
			name:     "dropped-triggers",
			injects:  "a trigger publisher that loses 50% of the triggers, then all of them for the last appends; safety net every 2 s",
			checks:   "every event in every read model; the last appends, with no trigger at all, are healed by the safety net within its interval",
			settings: scenarioSettings{safetyNet: 2 * time.Second},
			run:      runDroppedTriggers,
			after:    checkDropped,
		},
		{
			name:     "long-transaction",
			injects:  "a transaction holding an xid open for 30 s during live load",
			checks:   "the projections wait (no event handled while held), their status says HeldByHorizon, then they catch up without skipping an event",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runLongTransaction,
		},
		{
			name:     "poison",
			injects:  "an event the exactly-once projection fails on until a row in a control table fixes it; fix, then `nudge deadletter replay --projection chaos_exact`",
			checks:   "only that projection stops, right before the event; one folded dead letter; the others keep a low lag; after fix and replay it catches up and the record is replayed",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runPoison,
			after:    checkPoison,
		},
		parkScenario(),
		rebuildScenario(),
		scaleScenario(),
		fleetScenario(),
		repartitionScenario(),
		{
			name:     "malformed-input",
			injects:  "random bytes, truncated JSON, oversized and unknown-version triggers, empty and wrongly typed ones, published straight to every projection's queue",
			checks:   "each is dead-lettered at once with its reason and its bytes; the consumers keep going and the projections catch up",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runMalformed,
			after:    checkMalformed,
		},
		{
			name:     "security",
			injects:  "projection names with SQL and AMQP metacharacters; passwords in every connection URL, wrong DSNs and a wrong broker password",
			checks:   "the names are refused before any SQL or broker call (also with the database and broker out of reach); no password appears in any process's output",
			settings: scenarioSettings{safetyNet: safetyNetDefault},
			run:      runSecurity,
			after:    checkSecrets,
		},
	}
}

// startAll starts the workers (and the relay process, if any) and then the writers.
func (e *env) startAll(ctx context.Context) error {
	if err := e.workers.startAll(ctx); err != nil {
		return err
	}
	if e.relayProc != nil {
		if _, err := e.startRelayProc(ctx); err != nil {
			return err
		}
	}
	e.load.start(ctx)
	return nil
}

// runSigkill: kills during the catch-up of a backlog, then under live load.
func runSigkill(ctx context.Context, e *env, r *result) error {
	const (
		backlog      = 20000
		catchUpKills = 15
		minKills     = 24
		minLive      = 12 * time.Second
	)
	if err := e.load.backlog(ctx, backlog); err != nil {
		return err
	}
	backlogHead, err := e.store.Head(ctx)
	if err != nil {
		return err
	}
	e.s.progress(e.name, "backlog of %d events appended; starting the workers", backlog)
	for _, s := range e.workers.slots {
		if _, err := s.start(); err != nil {
			return err
		}
	}
	catchUpStarted := time.Now()
	e.load.start(ctx)
	killOne := func() {
		s := e.workers.slots[e.rng.IntN(len(e.workers.slots))]
		if s.kill() {
			r.Faults++
		}
		if _, err := s.start(); err != nil {
			r.addCheck("restart", false, "%v", err)
		}
	}
	// Catch-up: kill while the projections still work through the backlog.
	inCatchUp := 0
	for inCatchUp < catchUpKills {
		if err := backoff.Sleep(ctx, e.between(100*time.Millisecond, 400*time.Millisecond)); err != nil {
			return err
		}
		if e.caughtUpTo(ctx, backlogHead) {
			break
		}
		killOne()
		inCatchUp = r.Faults
	}
	e.s.progress(e.name, "%d kills during catch-up (%s); now under live load", inCatchUp, time.Since(catchUpStarted).Round(100*time.Millisecond))
	liveStart := time.Now()
	for r.Faults < minKills || time.Since(liveStart) < minLive {
		if err := backoff.Sleep(ctx, e.between(300*time.Millisecond, 1100*time.Millisecond)); err != nil {
			return err
		}
		killOne()
	}
	r.FaultKind = "SIGKILLs"
	r.Notes = append(r.Notes, fmt.Sprintf("%d kills during the catch-up of a %d-event backlog, %d under live load", inCatchUp, backlog, r.Faults-inCatchUp))
	r.addCheck("kills during catch-up", inCatchUp >= 5, "%d before the backlog was handled", inCatchUp)
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

// runConnectionCut: the broker closes every connection of the scenario, several times.
func runConnectionCut(ctx context.Context, e *env, r *result) error {
	const cuts = 4
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	closed := 0
	var lastCut time.Time
	for i := range cuts {
		n, issued, err := e.s.broker.closeConnections(ctx, e.prefix)
		if err != nil {
			return fmt.Errorf("cut %d: %w", i+1, err)
		}
		closed += n
		lastCut = issued
		r.Faults++
		e.s.progress(e.name, "cut %d closed %d connections", i+1, n)
		r.addCheck(fmt.Sprintf("cut %d closes the workers' and the publisher's connections", i+1), n >= 3, "%d closed", n)
		if i < cuts-1 {
			if err := backoff.Sleep(ctx, e.between(2500*time.Millisecond, 4500*time.Millisecond)); err != nil {
				return err
			}
		}
	}
	r.FaultKind = fmt.Sprintf("cuts (%d connections)", closed)
	e.faultEnd = lastCut // the clients see the outage from the first close on
	return backoff.Sleep(ctx, 3*time.Second)
}

// runPostgresRestart: fast shutdown and start of the private cluster, several times.
func runPostgresRestart(ctx context.Context, e *env, r *result) error {
	const restarts = 3
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	for i := range restarts {
		began := time.Now()
		if err := e.s.cluster.Stop(ctx, "fast"); err != nil {
			return fmt.Errorf("restart %d: %w", i+1, err)
		}
		if err := backoff.Sleep(ctx, 1500*time.Millisecond); err != nil {
			return err
		}
		if err := e.s.cluster.Start(ctx); err != nil {
			return fmt.Errorf("restart %d: %w", i+1, err)
		}
		r.Faults++
		e.s.progress(e.name, "restart %d: down for %s", i+1, time.Since(began).Round(10*time.Millisecond))
		if i < restarts-1 {
			if err := backoff.Sleep(ctx, e.between(3*time.Second, 5*time.Second)); err != nil {
				return err
			}
		}
	}
	r.FaultKind = "restarts"
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

// runDroppedTriggers: half the triggers are lost, then all of them for the last appends.
func runDroppedTriggers(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	e.lossy.setDropRate(0.5)
	if err := backoff.Sleep(ctx, 12*time.Second); err != nil {
		return err
	}
	// Every trigger of the last appends is lost: only the safety net can bring them in.
	e.lossy.setDropRate(1)
	e.droppedBefore = e.lossy.dropped.Load()
	if err := backoff.Sleep(ctx, time.Second); err != nil {
		return err
	}
	e.load.stopWriters()
	e.faultsOver()
	return nil
}

// checkDropped: the safety net brought in the last appends, whose triggers were all lost.
func checkDropped(_ context.Context, e *env, r *result) error {
	dropped := e.lossy.dropped.Load()
	r.Faults = int(dropped)
	r.FaultKind = fmt.Sprintf("triggers dropped (%d sent, %d dropped while all were lost)", e.lossy.sent.Load(), dropped-e.droppedBefore)
	limit := e.settings.safetyNet + 5*time.Second
	r.addCheck("healed by the safety net", r.Recover >= 0 && r.Recover <= limit,
		"the last appends, all their triggers lost, were handled %s after the last one (limit %s)", round(r.Recover), limit)
	return nil
}

// runLongTransaction: a transaction holds an xid for 30 s during live load.
func runLongTransaction(ctx context.Context, e *env, r *result) error {
	const hold = 30 * time.Second
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	var xid uint64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		return err
	}
	r.Faults, r.FaultKind = 1, fmt.Sprintf("transaction held %s", hold)
	heldAt := time.Now()
	e.s.progress(e.name, "transaction %d holds the horizon for %s", xid, hold)
	held := map[string]bool{}
	var oldest time.Duration
	processed := func() (map[string]int64, error) {
		sts, err := e.statuses(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]int64{}
		for _, st := range sts {
			out[st.Name] = st.EventsProcessed
			if st.HeldByHorizon {
				held[st.Name] = true
				if st.Holder != nil {
					oldest = max(oldest, st.Holder.Age)
				}
			}
		}
		return out, nil
	}
	var early, late map[string]int64
	appendedEarly := 0
	for time.Since(heldAt) < hold {
		if err := backoff.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
		p, err := processed()
		if err != nil {
			continue
		}
		if early == nil && time.Since(heldAt) >= 3*time.Second {
			early, appendedEarly = p, e.load.ackedCount()
		}
		late = p
	}
	appendedLate := e.load.ackedCount()
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	e.faultsOver()
	e.s.progress(e.name, "transaction ended")
	for _, name := range chaosmodel.Names() {
		r.addCheck("HeldByHorizon "+name, held[name], "status showed HeldByHorizon: %t", held[name])
		r.addCheck("waits "+name, early != nil && late[name] == early[name], "events handled from 3 s into the hold to its end: %d (while %d were appended)",
			late[name]-early[name], appendedLate-appendedEarly)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("oldest open transaction seen by the status: %s", round(oldest)))
	return backoff.Sleep(ctx, 3*time.Second)
}

// runPoison: an event the exactly-once projection cannot handle until it is fixed.
func runPoison(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	poison, err := e.load.appendPoison(ctx)
	if err != nil {
		return err
	}
	e.poisonID, e.poisonAt = poison, time.Now()
	r.Faults, r.FaultKind = 1, "poison event"
	e.s.progress(e.name, "poison event %s appended", poison)
	// Wait for the dead letter, then let the load run on a little with the projection stopped.
	var recs []deadletter.Record
	wait := deadline(30 * time.Second)
	until := time.Now().Add(wait)
	for len(recs) == 0 && time.Now().Before(until) {
		if err := backoff.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
		recs, _ = e.dead.List(ctx, deadletter.Filter{Projection: chaosmodel.ExactProjection})
	}
	r.addCheck("dead-lettered", len(recs) > 0, "%d record(s) for %s within %s", len(recs), chaosmodel.ExactProjection, wait)
	e.s.progress(e.name, "dead-lettered after %s", time.Since(e.poisonAt).Round(10*time.Millisecond))
	if err := backoff.Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	st, err := e.status.Status(ctx, chaosmodel.ExactProjection)
	if err != nil {
		return err
	}
	// Right before it: the first event after the committed position is the poison event.
	next, err := e.store.Read(ctx, st.Position, eventstore.ReadOptions{Limit: 1, Types: []string{chaosmodel.EventType}, OmitPayload: true})
	if err != nil {
		return err
	}
	stopped := st.State == projection.StateFailing && st.FailingEvent != nil && st.FailingEvent.ID == poison &&
		len(next) == 1 && next[0].ID == poison
	r.addCheck("stops right before the poison event", stopped, "state %s, failing event %s, next event after its position %s",
		st.State, failingID(st), eventIDs(next))
	if recs, err = e.dead.List(ctx, deadletter.Filter{}); err != nil {
		return err
	}
	r.addCheck("one folded dead letter before the fix", len(recs) == 1 && recs[0].FailingEvent != nil && recs[0].FailingEvent.ID == poison,
		"%s", describeRecords(recs))

	// The fix, then the operator's replay through the CLI.
	e.fixedAt = time.Now()
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+chaosmodel.ControlTable+` (key) VALUES ($1)`, chaosmodel.PoisonFixedKey); err != nil {
		return err
	}
	out, code, err := e.s.runCLI(ctx, e, "poison-replay", []string{"deadletter", "replay", "--projection", chaosmodel.ExactProjection, "--by", "chaos"}, nil)
	if err != nil {
		return err
	}
	r.addCheck("nudge deadletter replay", code == 0 && strings.Contains(out, "replayed 1 dead letter"), "exit %d: %s", code, strings.TrimSpace(out))
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

func failingID(st projection.Status) string {
	if st.FailingEvent == nil {
		return "none"
	}
	return st.FailingEvent.ID.String()
}

func eventIDs(events []eventstore.Event) string {
	if len(events) == 0 {
		return "none"
	}
	return events[0].ID.String()
}

func describeRecords(recs []deadletter.Record) string {
	var parts []string
	for _, rec := range recs {
		ev := "no event"
		if rec.FailingEvent != nil {
			ev = "event " + rec.FailingEvent.ID.String()
		}
		parts = append(parts, fmt.Sprintf("#%d %s %s count %d, %s", rec.ID, rec.Projection, rec.Status, rec.Count, ev))
	}
	if len(parts) == 0 {
		return "no records"
	}
	return strings.Join(parts, "; ")
}

// checkPoison: after the fix and the replay.
func checkPoison(ctx context.Context, e *env, r *result) error {
	recs, err := e.dead.List(ctx, deadletter.Filter{})
	if err != nil {
		return err
	}
	ok := len(recs) == 1 && recs[0].Projection == chaosmodel.ExactProjection && recs[0].Status == deadletter.StatusReplayed
	r.addCheck("the record is replayed", ok, "%s", describeRecords(recs))
	exact := e.verified.seen[chaosmodel.ExactProjection][e.poisonID]
	r.addCheck("the poison event is handled once after the fix", exact.Count == 1, "applied %d time(s)", exact.Count)
	for _, name := range []string{chaosmodel.IdempotentProjection, chaosmodel.FileProjection} {
		lag := maxLagBetween(e.verified.appended, e.verified.seen[name], e.poisonAt, e.fixedAt)
		const low = 5 * time.Second
		r.addCheck("low lag of "+name+" while poisoned", lag <= low, "max lag %s over the %s the poison stopped %s (limit %s)",
			round(lag), round(e.fixedAt.Sub(e.poisonAt)), chaosmodel.ExactProjection, low)
	}
	return nil
}

// malformed is one kind of bad message, sent to every projection's queue.
type malformed struct {
	kind string
	body []byte
	// noUUID leaves Watermill's message-UUID header out, as a foreign publisher would.
	noUUID bool
}

func malformedMessages(e *env) []malformed {
	random := make([]byte, 64)
	for i := range random {
		random[i] = byte(e.rng.IntN(256))
	}
	valid, _ := trigger.Trigger{Position: eventstore.Position{TransactionID: 1, GlobalPosition: 1}, At: time.Now(), Reason: trigger.ReasonAppend}.Encode()
	oversized := append([]byte(`{"v":1,"reason":"append","pad":"`), bytes.Repeat([]byte("x"), 2*trigger.MaxSize)...)
	oversized = append(oversized, `"}`...)
	huge := append([]byte(`{"v":1,"pad":"`), bytes.Repeat([]byte("y"), 256<<10)...)
	huge = append(huge, `"}`...)
	return []malformed{
		{kind: "random bytes", body: random},
		{kind: "truncated JSON", body: valid[:len(valid)/2]},
		{kind: "oversized (2 KiB)", body: oversized},
		{kind: "oversized (256 KiB)", body: huge},
		{kind: "unknown version", body: []byte(`{"v":99,"pos":"1/1","reason":"append","at":"2026-01-01T00:00:00Z"}`)},
		{kind: "no version", body: []byte(`{"pos":"1/1","reason":"append"}`)},
		{kind: "version as text", body: []byte(`{"v":"1","pos":"1/1"}`)},
		{kind: "bad position", body: []byte(`{"v":1,"pos":"x; DROP TABLE nudge_events"}`)},
		{kind: "empty", body: nil},
		{kind: "random bytes without a message UUID", body: random[:17], noUUID: true},
		{kind: "unknown version without a message UUID", body: []byte(`{"v":7}`), noUUID: true},
	}
}

// runMalformed publishes bad messages straight to every projection's queue under load.
func runMalformed(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	e.malformed = map[string]malformed{}
	for _, name := range chaosmodel.Names() {
		var msgs []rawMessage
		for _, m := range malformedMessages(e) {
			id := ""
			if !m.noUUID {
				id = uuid.NewString()
				e.malformed[name+"/"+id] = m
			}
			msgs = append(msgs, rawMessage{UUID: id, Body: m.body})
		}
		if err := e.s.broker.publishRaw(ctx, e.prefix+"garbage", queueName(e.prefix, name), msgs); err != nil {
			return err
		}
		r.Faults += len(msgs)
	}
	r.FaultKind = "bad messages"
	e.faultsOver()
	e.s.progress(e.name, "%d bad messages published", r.Faults)
	return backoff.Sleep(ctx, 5*time.Second)
}

// checkMalformed: each bad message is a dead letter with its reason and bytes.
func checkMalformed(ctx context.Context, e *env, r *result) error {
	recs, err := e.dead.List(ctx, deadletter.Filter{Limit: deadletter.ListLimitMax})
	if err != nil {
		return err
	}
	found := map[string]deadletter.Record{}
	var noUUID []deadletter.Record
	for _, rec := range recs {
		if rec.MessageUUID == "" {
			noUUID = append(noUUID, rec)
			continue
		}
		found[rec.Projection+"/"+rec.MessageUUID] = rec
	}
	var problems []string
	for key, m := range e.malformed {
		rec, ok := found[key]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: %s not dead-lettered", strings.Split(key, "/")[0], m.kind))
		case !strings.Contains(rec.Error, "invalid trigger"):
			problems = append(problems, fmt.Sprintf("%s: %s dead-lettered without a reason: %q", rec.Projection, m.kind, rec.Error))
		case rec.FailingEvent != nil || rec.Count != 1:
			problems = append(problems, fmt.Sprintf("%s: %s: failing event %v, count %d", rec.Projection, m.kind, rec.FailingEvent, rec.Count))
		case !bytes.Equal(rec.Payload, m.body):
			problems = append(problems, fmt.Sprintf("%s: %s: stored payload differs (%d bytes, sent %d)", rec.Projection, m.kind, len(rec.Payload), len(m.body)))
		}
	}
	slices.Sort(problems)
	r.addCheck("each bad message dead-lettered with its reason and bytes", len(problems) == 0, "%d of %d; %s",
		len(e.malformed)-len(problems), len(e.malformed), strings.Join(problems, "; "))
	for _, rec := range noUUID {
		r.Notes = append(r.Notes, fmt.Sprintf("%s: bad messages without a message UUID fold into one record (count %d): %s",
			rec.Projection, rec.Count, cut(rec.Error, 120)))
	}
	var reasons []string
	for _, rec := range recs {
		if rec.Projection == chaosmodel.ExactProjection {
			_, reason, _ := strings.Cut(rec.Error, "invalid trigger: ")
			reasons = append(reasons, cut(reason, 70))
		}
	}
	slices.Sort(reasons)
	r.Notes = append(r.Notes, "reasons: "+strings.Join(slices.Compact(reasons), " | "))
	return nil
}

// runCLI runs the nudge CLI with the scenario's connections in its environment (extra
// variables replace them), records its combined output under logs/<scenario>/cli/ and returns
// it with the exit code.
func (s *suite) runCLI(ctx context.Context, e *env, label string, args []string, extraEnv []string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, deadline(30*time.Second))
	defer cancel()
	cmd := exec.CommandContext(ctx, s.cliBin, args...)
	cmd.Env = append(os.Environ(), "NUDGE_DATABASE_URL="+e.dbURL, "NUDGE_AMQP_URL="+e.broker.url, "NUDGE_AMQP_PREFIX="+e.prefix)
	cmd.Env = append(cmd.Env, extraEnv...)
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		return "", 0, fmt.Errorf("run nudge %s: %w", label, err)
	}
	dir := e.logDir + "/cli"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	record := fmt.Sprintf("$ nudge %s\nexit %d\n%s", strings.Join(redact.Args(args), " "), code, out)
	if err := os.WriteFile(dir+"/"+label+".out", []byte(record), 0o644); err != nil {
		return "", 0, err
	}
	return string(out), code, nil
}

// poisonedCount returns the fold count of the poison event's dead-letter record, 0 if none.
func (e *env) poisonedCount(ctx context.Context) int {
	recs, err := e.dead.List(ctx, deadletter.Filter{Projection: chaosmodel.ExactProjection})
	if err != nil {
		return 0
	}
	for _, rec := range recs {
		if rec.FailingEvent != nil && rec.FailingEvent.ID == e.poisonID {
			return rec.Count
		}
	}
	return 0
}

// crash stops the private cluster as a crash would (pg_ctl stop -m immediate: no checkpoint,
// the server recovers from the WAL at its next start) and starts it again.
func (e *env) crash(ctx context.Context, r *result, what string) error {
	began := time.Now()
	if err := e.s.cluster.Stop(ctx, "immediate"); err != nil {
		return fmt.Errorf("crash %d (%s): %w", r.Faults+1, what, err)
	}
	if err := e.s.cluster.Start(ctx); err != nil {
		return fmt.Errorf("crash %d (%s): start again: %w", r.Faults+1, what, err)
	}
	r.Faults++
	r.Notes = append(r.Notes, fmt.Sprintf("crash %d %s: down and recovered in %s", r.Faults, what, round(time.Since(began))))
	e.s.progress(e.name, "crash %d %s: down and recovered in %s", r.Faults, what, time.Since(began).Round(10*time.Millisecond))
	return nil
}

// runPostgresCrash: the durable private cluster crashes (immediate stop) during the batches of
// a catch-up, under live load, and while dead letters of a poison event are being written.
func runPostgresCrash(ctx context.Context, e *env, r *result) error {
	const backlog = 8000
	if err := e.load.backlog(ctx, backlog); err != nil {
		return err
	}
	backlogHead, err := e.store.Head(ctx)
	if err != nil {
		return err
	}
	if err := e.startAll(ctx); err != nil {
		return err
	}
	// During the catch-up's batches, twice.
	for range 2 {
		if err := backoff.Sleep(ctx, e.between(300*time.Millisecond, 900*time.Millisecond)); err != nil {
			return err
		}
		what := "during the catch-up"
		if e.caughtUpTo(ctx, backlogHead) {
			what = "under live load"
		}
		if err := e.crash(ctx, r, what); err != nil {
			return err
		}
	}
	if err := backoff.Sleep(ctx, e.between(2*time.Second, 3*time.Second)); err != nil {
		return err
	}
	if err := e.crash(ctx, r, "under live load"); err != nil {
		return err
	}
	return crashWhileDeadLettering(ctx, e, r)
}

// crashWhileDeadLettering appends a poison event, crashes the cluster twice while its dead
// letter is folding (every trigger fails it again), then fixes it and replays.
func crashWhileDeadLettering(ctx context.Context, e *env, r *result) error {
	poison, err := e.load.appendPoison(ctx)
	if err != nil {
		return err
	}
	e.poisonID, e.poisonAt = poison, time.Now()
	for i := range 2 {
		// Wait until the record's count grows: dead letters are being written right now.
		start, until := e.poisonedCount(ctx), time.Now().Add(deadline(30*time.Second))
		for e.poisonedCount(ctx) <= start && time.Now().Before(until) {
			if err := backoff.Sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		folding := e.poisonedCount(ctx) > start
		r.addCheck(fmt.Sprintf("dead letters being written before crash %d", r.Faults+1), folding, "poison record count %d (was %d)", e.poisonedCount(ctx), start)
		if err := e.crash(ctx, r, "while dead-lettering"); err != nil {
			return err
		}
		if i == 0 {
			if err := backoff.Sleep(ctx, e.between(time.Second, 2*time.Second)); err != nil {
				return err
			}
		}
	}
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	e.fixedAt = time.Now()
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+chaosmodel.ControlTable+` (key) VALUES ($1)`, chaosmodel.PoisonFixedKey); err != nil {
		return err
	}
	out, code, err := e.s.runCLI(ctx, e, "poison-replay", []string{"deadletter", "replay", "--projection", chaosmodel.ExactProjection, "--by", "chaos"}, nil)
	if err != nil {
		return err
	}
	r.addCheck("nudge deadletter replay", code == 0 && strings.Contains(out, "replayed 1 dead letter"), "exit %d: %s", code, strings.TrimSpace(out))
	r.FaultKind = "crashes (pg_ctl stop -m immediate, fsync=on)"
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

// checkPostgresCrash: the crashes left no dead letter but the poison event's, replayed.
func checkPostgresCrash(ctx context.Context, e *env, r *result) error {
	recs, err := e.dead.List(ctx, deadletter.Filter{Limit: deadletter.ListLimitMax})
	if err != nil {
		return err
	}
	ok := len(recs) == 1 && recs[0].Projection == chaosmodel.ExactProjection && recs[0].FailingEvent != nil &&
		recs[0].FailingEvent.ID == e.poisonID && recs[0].Status == deadletter.StatusReplayed
	r.addCheck("no dead letter but the poison event's (replayed)", ok, "%s", describeRecords(recs))
	exact := e.verified.seen[chaosmodel.ExactProjection][e.poisonID]
	r.addCheck("the poison event is handled once after the fix", exact.Count == 1, "applied %d time(s)", exact.Count)
	return nil
}

// runBrokerRestart: the suite's own RabbitMQ node is stopped and started again, gracefully and
// by SIGKILL, while triggers are in flight; the workers' safety net is off, so only triggers
// that survived or were published again bring the events in.
func runBrokerRestart(ctx context.Context, e *env, r *result) error {
	if err := e.startAll(ctx); err != nil {
		return err
	}
	if err := e.broker.declareSurvivor(e.prefix); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	queues := []string{survivorQueue(e.prefix)}
	for _, n := range chaosmodel.Names() {
		queues = append(queues, queueName(e.prefix, n))
	}
	for i, graceful := range []bool{true, false} {
		before, err := e.broker.queueDepths(queues...)
		if err != nil {
			return err
		}
		down, err := e.restartBroker(ctx, graceful)
		if err != nil {
			return fmt.Errorf("restart %d: %w", i+1, err)
		}
		r.Faults++
		after, err := e.broker.queueDepths(queues...)
		survived := err == nil && after[survivorQueue(e.prefix)] >= before[survivorQueue(e.prefix)]
		r.addCheck(fmt.Sprintf("restart %d: queues, binding and persistent messages survive", i+1), survived,
			"survivor queue %d messages before, %d after (error: %s)", before[survivorQueue(e.prefix)], after[survivorQueue(e.prefix)], errText(err))
		r.Notes = append(r.Notes, fmt.Sprintf("restart %d (%s): the node was away %s", i+1, restartKind(graceful), round(down)))
		e.s.progress(e.name, "restart %d (%s): away %s; survivor queue %d → %d messages", i+1, restartKind(graceful),
			down.Round(10*time.Millisecond), before[survivorQueue(e.prefix)], after[survivorQueue(e.prefix)])
		if err := backoff.Sleep(ctx, e.between(2*time.Second, 3*time.Second)); err != nil {
			return err
		}
	}
	// Bound to the exchange after the restarts too: new triggers reach the survivor queue.
	grown, err := e.awaitSurvivorGrowth(ctx)
	r.addCheck("the binding delivers after the restarts", grown, "%v", errText(err))
	r.FaultKind = "restarts of a private node (rabbitmqctl stop, SIGKILL)"
	e.faultsOver()
	if err := backoff.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	restarted := e.workers.restarts()
	r.addCheck("consumers come back without a worker restart", restarted == 0, "%d worker restarts", restarted)
	return nil
}

func restartKind(graceful bool) string {
	if graceful {
		return "rabbitmqctl stop"
	}
	return "SIGKILL"
}

// restartBroker stops the private node (rabbitmqctl stop, or SIGKILL), keeps it away for a
// moment while appends continue, starts it and returns how long it was away.
func (e *env) restartBroker(ctx context.Context, graceful bool) (time.Duration, error) {
	began := time.Now()
	if graceful {
		if err := e.s.rabbit.Stop(ctx); err != nil {
			return 0, err
		}
	} else {
		e.s.rabbit.Kill()
	}
	if err := backoff.Sleep(ctx, time.Second); err != nil {
		return 0, err
	}
	if err := e.s.rabbit.Start(ctx); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}

// awaitSurvivorGrowth waits up to 10 s (scaled) for a new message in the survivor queue.
func (e *env) awaitSurvivorGrowth(ctx context.Context) (bool, error) {
	q := survivorQueue(e.prefix)
	first, err := e.broker.queueDepths(q)
	if err != nil {
		return false, err
	}
	wait := deadline(10 * time.Second)
	for until := time.Now().Add(wait); time.Now().Before(until); {
		if err := backoff.Sleep(ctx, 200*time.Millisecond); err != nil {
			return false, err
		}
		now, err := e.broker.queueDepths(q)
		if err == nil && now[q] > first[q] {
			return true, nil
		}
	}
	return false, fmt.Errorf("no new message in %s", wait)
}

// startRelayProc starts a new incarnation of the relay process and waits until it is ready;
// it returns when it was ready.
func (e *env) startRelayProc(ctx context.Context) (time.Time, error) {
	p, err := e.relayProc.start()
	if err != nil {
		return time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, deadline(60*time.Second))
	defer cancel()
	if err := p.waitReady(ctx); err != nil {
		return time.Time{}, fmt.Errorf("relay: %w (see its log)", err)
	}
	return time.Now(), nil
}

// relayBoundSlack is what the relay-kill scenario allows beyond the relay's longest absence:
// the relay's polling, the trigger's way through the broker and the batch that applies it.
const relayBoundSlack = 5 * time.Second

// runRelayKill: the relay, in a process of its own, is SIGKILLed again and again under load
// while the workers' safety net is off: only the relay's triggers bring events in.
func runRelayKill(ctx context.Context, e *env, r *result) error {
	const kills = 12
	if err := e.startAll(ctx); err != nil {
		return err
	}
	var longest time.Duration
	for range kills {
		if err := backoff.Sleep(ctx, e.between(500*time.Millisecond, 1500*time.Millisecond)); err != nil {
			return err
		}
		killed := time.Now()
		if !e.relayProc.kill() {
			r.addCheck("the relay runs until killed", false, "it had exited before kill %d", r.Faults+1)
		}
		r.Faults++
		// Stay away a moment while the writers append: those events wait for the next relay.
		if err := backoff.Sleep(ctx, e.between(200*time.Millisecond, 800*time.Millisecond)); err != nil {
			return err
		}
		ready, err := e.startRelayProc(ctx)
		if err != nil {
			return err
		}
		longest = max(longest, ready.Sub(killed))
	}
	e.relayDown = longest
	r.FaultKind = "relay SIGKILLs"
	e.faultsOver()
	return backoff.Sleep(ctx, 3*time.Second)
}

// checkRelayKill: every event was applied within the relay's longest absence plus the slack.
func checkRelayKill(_ context.Context, e *env, r *result) error {
	bound := e.relayDown + relayBoundSlack
	for _, m := range r.Models {
		r.addCheck("max lag within the bound: "+m.Name, m.MaxLag <= bound, "max lag %s, bound %s (longest relay absence %s + %s)",
			round(m.MaxLag), round(bound), round(e.relayDown), relayBoundSlack)
	}
	return nil
}
