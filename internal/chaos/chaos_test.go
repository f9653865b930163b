package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
)

// These tests cover the suite's verification logic, which decides PASS or FAIL; the suite
// itself runs from `make chaos`.

func ids(n int) []uuid.UUID {
	out := make([]uuid.UUID, n)
	for i := range out {
		out[i] = uuid.New()
	}
	return out
}

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestCompareCountsMissingDuplicatesAndUnknown(t *testing.T) {
	ev := ids(5)
	appended := map[uuid.UUID]time.Time{}
	for i, id := range ev {
		appended[id] = t0.Add(time.Duration(i) * time.Second)
	}
	phantom := uuid.New()
	seen := map[uuid.UUID]sighting{
		ev[0]:   {Count: 1, First: t0.Add(100 * time.Millisecond)},
		ev[1]:   {Count: 3, First: t0.Add(1500 * time.Millisecond)}, // two duplicates, lag 500 ms
		ev[2]:   {Count: 1, First: t0.Add(2 * time.Second)},
		ev[3]:   {Count: 0}, // a row that says "never applied" counts as missing
		phantom: {Count: 1, First: t0},
	}

	exact := compare("m", true, appended, seen)
	require.Equal(t, 3, exact.Projected)
	require.Equal(t, 2, exact.Missing, "ev[3] and ev[4]")
	require.ElementsMatch(t, []uuid.UUID{ev[3], ev[4]}, exact.MissingSample)
	require.Equal(t, 2, exact.Duplicated)
	require.Equal(t, 1, exact.Unknown, "an event that was never appended")
	require.Equal(t, 500*time.Millisecond, exact.MaxLag)
	require.False(t, exact.ok())

	// Complete, with duplicates: fails only an exactly-once model.
	full := map[uuid.UUID]sighting{}
	for id, at := range appended {
		full[id] = sighting{Count: 2, First: at}
	}
	require.True(t, compare("m", false, appended, full).ok(), "at-least-once: duplicates allowed")
	require.False(t, compare("m", true, appended, full).ok(), "exactly-once: a duplicate fails")
	for id, at := range appended {
		full[id] = sighting{Count: 1, First: at}
	}
	require.True(t, compare("m", true, appended, full).ok())
}

func TestCompareEmpty(t *testing.T) {
	r := compare("m", true, map[uuid.UUID]time.Time{}, map[uuid.UUID]sighting{})
	require.True(t, r.ok())
	require.Zero(t, r.Projected)
}

func TestMaxLagBetween(t *testing.T) {
	ev := ids(3)
	appended := map[uuid.UUID]time.Time{ev[0]: t0, ev[1]: t0.Add(10 * time.Second), ev[2]: t0.Add(20 * time.Second)}
	seen := map[uuid.UUID]sighting{
		ev[0]: {Count: 1, First: t0.Add(9 * time.Second)}, // before the window
		ev[1]: {Count: 1, First: t0.Add(11 * time.Second)},
		// ev[2] missing: counted elsewhere
	}
	require.Equal(t, time.Second, maxLagBetween(appended, seen, t0.Add(5*time.Second), t0.Add(25*time.Second)))
	require.Equal(t, 9*time.Second, maxLagBetween(appended, seen, t0, t0.Add(25*time.Second)))
}

// sinkLine is a line of the file model for id, applied at nanos, of stream s at version v.
func sinkLine(id uuid.UUID, nanos int64, s string, v int64) string {
	return string(chaosmodel.Line{ID: id, At: time.Unix(0, nanos), Stream: s, Version: v, Writer: 1, Seq: int(v)}.AppendText(nil))
}

func TestParseSinkCountsTornLinesAndDuplicates(t *testing.T) {
	a, b := uuid.New(), uuid.New()
	text := sinkLine(a, 1000, "s", 1) +
		sinkLine(b, 3000, "s", 2) +
		sinkLine(a, 500, "s", 1) + // a duplicate, earlier: First is the earliest
		"not-a-uuid 7 s 1 1 1\n" +
		a.String() + " 7\n" + // the old format: fields missing
		sinkLine(b, 4000, "s", 2)[:20] // killed mid-write: no newline
	seen := map[uuid.UUID]sighting{}
	torn, err := parseSink(strings.NewReader(text), seen)
	require.NoError(t, err)
	require.Equal(t, 3, torn)
	require.Equal(t, sighting{Count: 2, First: time.Unix(0, 500), Order: 500, Content: content{Stream: "s", Version: 1, Writer: 1, Seq: 1}}, seen[a])
	require.Equal(t, sighting{Count: 1, First: time.Unix(0, 3000), Order: 3000, Content: content{Stream: "s", Version: 2, Writer: 1, Seq: 2}}, seen[b])
}

func TestReadSinksReadsEveryFileOfTheDirectory(t *testing.T) {
	dir := t.TempDir()
	a, b := uuid.New(), uuid.New()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "worker-1.1.lines"), []byte(sinkLine(a, 1, "s", 1)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "worker-2.1.lines"), []byte(sinkLine(a, 2, "s", 1)+sinkLine(b, 3, "s", 2)+"torn"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other.txt"), []byte(sinkLine(b, 3, "s", 2)), 0o644))
	seen, torn, err := readSinks(dir)
	require.NoError(t, err)
	require.Equal(t, 1, torn)
	require.Equal(t, 2, seen[a].Count)
	require.Equal(t, 1, seen[b].Count, "only *.lines files are sinks")
}

func TestCheckContentFindsOtherContentAndStreamOrder(t *testing.T) {
	ev := ids(5)
	stored := map[uuid.UUID]content{
		ev[0]: {Stream: "a", Version: 1, Writer: 0, Seq: 0},
		ev[1]: {Stream: "a", Version: 2, Writer: 0, Seq: 1},
		ev[2]: {Stream: "a", Version: 3, Writer: 0, Seq: 2},
		ev[3]: {Stream: "b", Version: 1, Writer: 1, Seq: 0},
		ev[4]: {Stream: "b", Version: 2, Writer: 1, Seq: 1},
	}
	right := func(id uuid.UUID, order int64) sighting { return sighting{Count: 1, Content: stored[id], Order: order} }
	// Streams interleave freely; within a stream the versions come in order.
	good := map[uuid.UUID]sighting{ev[0]: right(ev[0], 1), ev[3]: right(ev[3], 2), ev[1]: right(ev[1], 3), ev[4]: right(ev[4], 4), ev[2]: right(ev[2], 5)}
	mismatched, outOfOrder := checkContent(stored, good)
	require.Zero(t, mismatched)
	require.Zero(t, outOfOrder)

	// Version 3 of a applied before version 2; b's second event holds another seq.
	bad := map[uuid.UUID]sighting{ev[0]: right(ev[0], 1), ev[2]: right(ev[2], 2), ev[1]: right(ev[1], 3), ev[3]: right(ev[3], 4), ev[4]: right(ev[4], 5)}
	wrong := bad[ev[4]]
	wrong.Content.Seq = 7
	bad[ev[4]] = wrong
	mismatched, outOfOrder = checkContent(stored, bad)
	require.Equal(t, 1, mismatched)
	require.Equal(t, 1, outOfOrder)
	m := compare("m", true, map[uuid.UUID]time.Time{}, nil)
	m.Mismatched, m.OutOfOrder = mismatched, outOfOrder
	require.False(t, m.ok(), "other content or order fails a model")
}

func TestChaosModelWritesLinesTheVerifierReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.lines")
	m, err := chaosmodel.New(chaosmodel.Config{DB: noDB{}, SinkPath: path})
	require.NoError(t, err)
	id := uuid.New()
	before := time.Now()
	require.NoError(t, m.Projections[2].Handle(context.Background(), nil, eventOf(id)))
	after := time.Now()
	require.NoError(t, m.Close())
	seen, torn, err := readSinks(filepath.Dir(path))
	require.NoError(t, err)
	require.Zero(t, torn)
	require.Equal(t, 1, seen[id].Count)
	require.Equal(t, content{Stream: "chaos-w0-s1", Version: 4, Writer: 0, Seq: 1}, seen[id].Content, "the line holds the event's stream, version and payload")
	require.False(t, seen[id].First.Before(before) || seen[id].First.After(after),
		"the line records when the event was handled: %s is not within [%s, %s]", seen[id].First, before, after)
}

func TestRecoveryTime(t *testing.T) {
	before, after, later := uuid.New(), uuid.New(), uuid.New()
	end := t0.Add(10 * time.Second)
	appended := map[uuid.UUID]time.Time{before: t0, after: end.Add(100 * time.Millisecond), later: end.Add(5 * time.Second)}
	fast := map[uuid.UUID]sighting{
		before: {Count: 1, First: t0.Add(time.Second)},
		after:  {Count: 1, First: end.Add(300 * time.Millisecond)},
		later:  {Count: 1, First: end.Add(9 * time.Second)}, // not needed: only the first event after end counts
	}
	slow := map[uuid.UUID]sighting{
		before: {Count: 1, First: end.Add(2 * time.Second)}, // held back by the fault
		after:  {Count: 1, First: end.Add(2 * time.Second)},
		later:  {Count: 1, First: end.Add(5 * time.Second)},
	}
	d, ok := recoveryTime(appended, []map[uuid.UUID]sighting{fast}, end)
	require.True(t, ok)
	require.Equal(t, 300*time.Millisecond, d, "the first append after the fault went through in 300 ms")
	d, ok = recoveryTime(appended, []map[uuid.UUID]sighting{fast, slow}, end)
	require.True(t, ok)
	require.Equal(t, 2*time.Second, d, "the slowest model decides")

	// No append after the end: the backlog alone; never negative.
	delete(appended, after)
	delete(appended, later)
	d, ok = recoveryTime(appended, []map[uuid.UUID]sighting{fast}, end)
	require.True(t, ok)
	require.Zero(t, d)

	_, ok = recoveryTime(appended, []map[uuid.UUID]sighting{{}}, end)
	require.False(t, ok, "a model missing a needed event has not recovered")
}

func TestResultLineAndVerdict(t *testing.T) {
	r := &result{Scenario: "sigkill", Faults: 22, FaultKind: "SIGKILLs", Appended: 10, Recover: 1500 * time.Millisecond, Took: 30 * time.Second,
		Models: []modelResult{
			{Name: chaosmodel.ExactProjection, ExactlyOnce: true, Projected: 10, MaxLag: 40 * time.Millisecond},
			{Name: chaosmodel.IdempotentProjection, Projected: 10, Duplicated: 4},
			{Name: chaosmodel.FileProjection, Projected: 10},
		}}
	r.addCheck("kills during catch-up", true, "%d", 12)
	r.finish()
	require.True(t, r.Passed, "duplicates in at-least-once models pass")
	line := r.line()
	require.NotContains(t, line, "\n", "one line per scenario")
	for _, want := range []string{"sigkill", "faults=22 SIGKILLs", "appended=10", "exact:10,idem:10,file:10", "missing=0",
		"duplicated(exactly-once)=0", "max_lag exact:40ms", "recover=1.5s", "PASS"} {
		require.Contains(t, line, want)
	}

	r.Models[0].Duplicated = 1
	r.addCheck("status said HeldByHorizon", false, "never")
	r.finish()
	require.False(t, r.Passed)
	require.Contains(t, r.line(), "FAIL")
	require.Contains(t, r.line(), "duplicated(exactly-once)=1")
	require.Contains(t, r.line(), "status said HeldByHorizon: never")

	notRun := &result{Scenario: "poison", Recover: -1, Error: "not run"}
	notRun.finish()
	require.False(t, notRun.Passed, "a scenario without verified models never passes")
	require.Contains(t, notRun.line(), "recover=n/a")
}

func TestClearPasswordURLFindsUnredactedPasswords(t *testing.T) {
	leaks := func(line string) bool {
		for _, m := range clearPasswordURL.FindAllStringSubmatch(line, -1) {
			if m[1] != "xxxxx" {
				return true
			}
		}
		return false
	}
	require.True(t, leaks(`{"msg":"connect","url":"postgres://postgres:s3cret@127.0.0.1:5432/db"}`))
	require.True(t, leaks(`dial amqp://guest:guest@localhost:5672/ failed`))
	require.False(t, leaks(`{"url":"amqp://guest:xxxxx@127.0.0.1:5672/"}`))
	require.False(t, leaks(`postgres://postgres@127.0.0.1:5432/db user without a password`))
	require.False(t, leaks(`at 2026-01-01T00:00:00Z took 3s`))
	require.Equal(t, []string{"nudge", "--db", "postgres://u:xxxxx@h/db"}, redact.Args([]string{"nudge", "--db", "postgres://u:pw@h/db"}))
}

// TestHandledByUsesEachPartitionsPosition: a version's table is checked up to its position,
// or, partitioned, each stream up to its own partition's position.
func TestHandledByUsesEachPartitionsPosition(t *testing.T) {
	at := func(gp int64) eventstore.Position {
		return eventstore.Position{TransactionID: uint64(gp), GlobalPosition: gp}
	}
	streams := map[int]string{}
	for i := 0; len(streams) < 2; i++ {
		s := fmt.Sprintf("s-%d", i)
		if _, ok := streams[eventstore.PartitionOf(s, 2)]; !ok {
			streams[eventstore.PartitionOf(s, 2)] = s
		}
	}
	ev := func(stream string, gp int64) eventstore.Event {
		return eventstore.Event{StreamID: stream, Position: at(gp)}
	}

	plain := handledBy(projection.Status{Position: at(10)})
	require.True(t, plain(ev(streams[0], 10)))
	require.False(t, plain(ev(streams[1], 11)))

	parted := handledBy(projection.Status{Position: at(10), Partitions: []projection.Status{
		{Position: at(10), Partition: eventstore.Partition{Index: 0, Count: 2}},
		{Position: at(20), Partition: eventstore.Partition{Index: 1, Count: 2}},
	}})
	require.True(t, parted(ev(streams[0], 10)))
	require.False(t, parted(ev(streams[0], 15)), "after partition 0's position")
	require.True(t, parted(ev(streams[1], 15)), "partition 1 is further")
	require.False(t, parted(ev(streams[1], 21)))
}

func TestSelectScenarios(t *testing.T) {
	all := scenarios()
	got, err := selectScenarios(all, "all")
	require.NoError(t, err)
	require.Len(t, got, 15)
	require.Equal(t, "security", got[len(got)-1].name, "security runs last: it searches the others' outputs")
	got, err = selectScenarios(all, "poison, sigkill")
	require.NoError(t, err)
	require.Equal(t, "poison", got[0].name)
	require.Equal(t, "sigkill", got[1].name)
	_, err = selectScenarios(all, "nope")
	require.ErrorContains(t, err, "unknown scenario")
	for _, sc := range all {
		require.NotEmpty(t, sc.injects, sc.name)
		require.NotEmpty(t, sc.checks, sc.name)
		if sc.name == "broker-restart" || sc.name == "relay-kill" {
			require.Negative(t, sc.settings.safetyNet, "%s: only triggers may bring the events in", sc.name)
			continue
		}
		require.Positive(t, sc.settings.safetyNet, sc.name)
	}
}

// TestReliabilityDocumentsEveryScenario: RELIABILITY.md has a section per scenario, in the
// order "all" runs them, and none for a scenario that does not exist.
func TestReliabilityDocumentsEveryScenario(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "RELIABILITY.md"))
	require.NoError(t, err)
	_, section, found := strings.Cut(string(doc), "\n## Scenarios\n")
	require.True(t, found, "RELIABILITY.md has no Scenarios section")
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, line := range strings.Split(section, "\n") {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			documented = append(documented, strings.TrimSpace(name))
		}
	}
	var names []string
	for _, sc := range scenarios() {
		names = append(names, sc.name)
	}
	require.Equal(t, names, documented, "the ### sections of RELIABILITY.md's Scenarios")
}

func TestLossyPublisherDropsItsShare(t *testing.T) {
	inner := &countingPublisher{}
	p := &lossyPublisher{inner: inner, rng: rand.New(rand.NewPCG(1, 2))}
	ctx := context.Background()
	for range 100 {
		require.NoError(t, p.Publish(ctx, trigger.Trigger{}))
	}
	require.Equal(t, 100, inner.n, "nothing dropped by default")
	p.setDropRate(0.5)
	for range 1000 {
		require.NoError(t, p.Publish(ctx, trigger.Trigger{}), "a dropped trigger looks sent")
	}
	require.InDelta(t, 500, p.dropped.Load(), 80)
	p.setDropRate(1)
	before := inner.n
	for range 100 {
		require.NoError(t, p.Publish(ctx, trigger.Trigger{}))
	}
	require.Equal(t, before, inner.n, "all lost")
}

type countingPublisher struct{ n int }

func (c *countingPublisher) Publish(context.Context, trigger.Trigger) error { c.n++; return nil }

// noDB is a chaosmodel.DB that writes nothing.
type noDB struct{}

func (noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, nil
}

func eventOf(id uuid.UUID) eventstore.Event {
	return eventstore.Event{ID: id, StreamID: "chaos-w0-s1", StreamVersion: 4, Type: chaosmodel.EventType, Payload: []byte(`{"w":0,"n":1}`)}
}

// script writes an executable shell script to a temporary directory and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proc")
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	return path
}

func TestWorkerSlotReportsASelfExitAndAHangButNotTheSuitesKills(t *testing.T) {
	slot := func(body string) *workerSlot {
		return &workerSlot{name: "w", set: workerSettings{binary: script(t, body), logDir: t.TempDir(), relay: true}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Exits by itself after ready: reported with its exit status.
	crash := slot("echo ready; exit 3")
	p, err := crash.start()
	require.NoError(t, err)
	require.NoError(t, p.waitReady(ctx))
	<-p.done
	err = (&pool{slots: []*workerSlot{crash}}).problems()
	require.ErrorContains(t, err, "w.1 exited by itself (exit status 3)")

	// Ignores SIGTERM: the graceful stop's deadline passes, SIGKILL ends it, and that is reported.
	hang := slot("trap '' TERM; echo ready; while :; do sleep 1; done")
	p, err = hang.start()
	require.NoError(t, err)
	require.NoError(t, p.waitReady(ctx))
	hang.stop(300 * time.Millisecond)
	err = (&pool{slots: []*workerSlot{hang}}).problems()
	require.ErrorContains(t, err, "w.1 hung at shutdown")

	// Killed by the suite, and stopped gracefully: nothing to report.
	fine := slot("trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done")
	for range 2 {
		p, err = fine.start()
		require.NoError(t, err)
		require.NoError(t, p.waitReady(ctx))
		require.True(t, fine.kill())
	}
	p, err = fine.start()
	require.NoError(t, err)
	require.NoError(t, p.waitReady(ctx))
	fine.stop(time.Minute)
	require.NoError(t, (&pool{slots: []*workerSlot{fine}}).problems())
	require.Equal(t, 2, (&pool{slots: []*workerSlot{fine}}).restarts())
}

func TestCloseConnectionsRefusesAPrefixItCannotPutIntoErlang(t *testing.T) {
	// Refused before rabbitmqctl runs: the prefix goes into Erlang code as is.
	t.Setenv("NUDGE_TEST_RABBITMQCTL", "/nonexistent/rabbitmqctl")
	for _, bad := range []string{`x">>, halt(), <<"`, "a b", ""} {
		_, _, err := (&broker{}).closeConnections(context.Background(), bad)
		require.ErrorContains(t, err, "unexpected prefix", bad)
	}
	_, _, err := (&broker{}).closeConnections(context.Background(), "nudge_chaos.1.connection-cut.")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "unexpected prefix", "a prefix the suite builds goes on to rabbitmqctl")
	require.Contains(t, closeConnectionsErlang, "~s")
}

func TestWaitReadyOfAWorkerThatPrintedReadyAndExitedSince(t *testing.T) {
	// Both channels closed before waitReady looks (the script of the test above, "echo ready;
	// exit 3", can get there first): a select over the two would pick either.
	p := &workerProc{ready: make(chan struct{}), done: make(chan struct{}), err: errors.New("exit status 3")}
	close(p.ready)
	close(p.done)
	for range 100 {
		require.NoError(t, p.waitReady(context.Background()))
	}
	notReady := &workerProc{ready: make(chan struct{}), done: make(chan struct{}), err: errors.New("exit status 3")}
	close(notReady.done)
	require.ErrorContains(t, notReady.waitReady(context.Background()), "worker exited before it was ready: exit status 3")
}
