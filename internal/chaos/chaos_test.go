package main

import (
	"context"
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

func TestParseSinkCountsTornLinesAndDuplicates(t *testing.T) {
	a, b := uuid.New(), uuid.New()
	text := a.String() + " 1000\n" +
		b.String() + " 3000\n" +
		a.String() + " 500\n" + // a duplicate, earlier: First is the earliest
		"not-a-uuid 7\n" +
		b.String()[:10] // killed mid-write: no newline
	seen := map[uuid.UUID]sighting{}
	torn, err := parseSink(strings.NewReader(text), seen)
	require.NoError(t, err)
	require.Equal(t, 2, torn)
	require.Equal(t, sighting{Count: 2, First: time.Unix(0, 500)}, seen[a])
	require.Equal(t, sighting{Count: 1, First: time.Unix(0, 3000)}, seen[b])
}

func TestReadSinksReadsEveryFileOfTheDirectory(t *testing.T) {
	dir := t.TempDir()
	a, b := uuid.New(), uuid.New()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "worker-1.1.lines"), []byte(a.String()+" 1\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "worker-2.1.lines"), []byte(a.String()+" 2\n"+b.String()+" 3\n"+"torn"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other.txt"), []byte(b.String()+" 3\n"), 0o644))
	seen, torn, err := readSinks(dir)
	require.NoError(t, err)
	require.Equal(t, 1, torn)
	require.Equal(t, 2, seen[a].Count)
	require.Equal(t, 1, seen[b].Count, "only *.lines files are sinks")
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

func TestSelectScenarios(t *testing.T) {
	all := scenarios()
	got, err := selectScenarios(all, "all")
	require.NoError(t, err)
	require.Len(t, got, 9)
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
		require.Positive(t, sc.settings.safetyNet, sc.name)
	}
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
	return eventstore.Event{ID: id, Type: chaosmodel.EventType, Payload: []byte(`{"w":0,"n":1}`)}
}
