package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/lease"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

// syncBuffer is a bytes.Buffer that a running CLI writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCLI runs the CLI in the background until it ends or ctx does; wait returns its exit
// code (failing the test if it takes longer than limit).
func startCLI(t *testing.T, ctx context.Context, env map[string]string, args ...string) (stdout, stderr *syncBuffer, wait func(limit time.Duration) int) {
	t.Helper()
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, stdout, stderr, func(k string) string { return env[k] }) }()
	return stdout, stderr, func(limit time.Duration) int {
		t.Helper()
		select {
		case code := <-done:
			return code
		case <-time.After(limit):
			t.Fatalf("nudge %s did not end within %s; stderr: %s", strings.Join(args, " "), limit, stderr)
			return -1
		}
	}
}

// statusFixture is newFixture's database with three projections registered by a real runner
// on the PostgreSQL backend, over five events A, B, C, A, C (events[0..4]):
//
//	caught_up (A):    caught up
//	lagging (A, B):   registered, never caught up
//	failing (C):      fails on events[2], with one dead letter (and a resolved one)
type statusFixture struct {
	*fixture
	runner *projection.Runner
	events []eventstore.Event
}

// appendToOrder appends events of types to the stream order-1 in f's database, waits until
// they are readable, and returns them with a projection backend on that store.
func appendToOrder(t *testing.T, f *fixture, types ...string) (eventstore.AppendResult, *pjpg.Backend) {
	t.Helper()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	events := make([]eventstore.EventData, len(types))
	for i, typ := range types {
		events[i] = eventstore.EventData{Type: typ, Payload: json.RawMessage(`{}`)}
	}
	res, err := store.Append(context.Background(), "order-1", eventstore.Any, events...)
	require.NoError(t, err)
	storetest.Settle(t, store, res.Last())
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	return res, backend
}

func newStatusFixture(t *testing.T) *statusFixture {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	res, backend := appendToOrder(t, f, "A", "B", "C", "A", "C")
	ok := func(context.Context, projection.Event[json.RawMessage]) error { return nil }
	caughtUp, err := projection.New("caught_up", projection.Config{}, projection.OnIdempotent("A", ok))
	require.NoError(t, err)
	lagging, err := projection.New("lagging", projection.Config{}, projection.OnIdempotent("A", ok), projection.OnIdempotent("B", ok))
	require.NoError(t, err)
	failing, err := projection.New("failing", projection.Config{}, projection.OnIdempotent("C",
		func(context.Context, projection.Event[json.RawMessage]) error { return errors.New("cannot take C") }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, caughtUp, lagging, failing)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, "caught_up")
	require.NoError(t, err)
	_, err = runner.CatchUp(ctx, "failing")
	require.ErrorIs(t, err, projection.ErrHandler)

	// One open dead letter on the failing event, and a resolved one (on another event: records
	// of one event fold together).
	for i, resolved := range map[int]bool{2: false, 4: true} {
		bad := res.Events[i]
		rec, err := f.store.Add(ctx, deadletter.Entry{Projection: "failing", MessageUUID: "m-" + strconv.FormatBool(resolved),
			Payload: []byte(`{"v":1}`), Error: "cannot take C", Attempts: 5, At: time.Now(),
			FailingEvent: &eventstore.EventRef{ID: bad.ID, Type: bad.Type, StreamID: bad.StreamID, Position: bad.Position}})
		require.NoError(t, err)
		if resolved {
			require.NoError(t, f.store.Resolve(ctx, rec.ID, "ops", "", time.Time{}))
		}
	}
	return &statusFixture{fixture: f, runner: runner, events: res.Events}
}

// TestStatusJSON checks every field of status --json for a caught-up, a lagging and a failing
// projection.
func TestStatusJSON(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	started := time.Now()

	res := settledStatus(t, f.env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got), res.stdout)
	require.Len(t, got, 3)
	byName := map[string]map[string]any{}
	for i, st := range got {
		byName[st["name"].(string)] = st
		// Times: RFC 3339, recent; fields that are not set are null.
		updated, err := time.Parse(time.RFC3339Nano, st["updated_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, started, updated, 10*time.Minute) // the fixture's time, before started
		require.Nil(t, st["rebuild_started_at"], i)
		require.Nil(t, st["rebuild"], i)
		require.Nil(t, st["last_skip"], i)
		require.InDelta(t, 0, st["parked_streams"], 0, i)
		require.Nil(t, st["oldest_parked_at"], i)
		require.Equal(t, false, st["held_by_horizon"], i)
		require.InDelta(t, 0, st["oldest_open_transaction_seconds"], 0, i)
		require.Equal(t, f.events[4].Position.String(), st["head"], "the store's head")
	}
	require.Equal(t, []any{"caught_up", "failing", "lagging"}, []any{got[0]["name"], got[1]["name"], got[2]["name"]}, "sorted by name")

	caughtUp := byName["caught_up"]
	require.Equal(t, "running", caughtUp["state"])
	require.Equal(t, "caught_up", caughtUp["condition"])
	require.Equal(t, f.events[3].Position.String(), caughtUp["position"], "the last A")
	require.InDelta(t, 0, caughtUp["lag_events"], 0)
	require.InDelta(t, 0, caughtUp["lag_seconds"], 0)
	require.InDelta(t, 2, caughtUp["events_processed"], 0)
	require.Nil(t, caughtUp["failing_event"])
	require.Empty(t, caughtUp["last_error"])
	require.InDelta(t, 0, caughtUp["attempts"], 0)
	require.Nil(t, caughtUp["first_failure_at"])
	require.Nil(t, caughtUp["last_failure_at"])
	require.InDelta(t, 0, caughtUp["dead_letters"], 0)

	lagging := byName["lagging"]
	require.Equal(t, "running", lagging["state"])
	require.Equal(t, "working", lagging["condition"])
	require.Equal(t, "0/0", lagging["position"])
	require.InDelta(t, 3, lagging["lag_events"], 0, "A, B, A: the types recorded at Init, not C")
	require.Greater(t, lagging["lag_seconds"], 0.0)
	require.Less(t, lagging["lag_seconds"], time.Since(started).Seconds()+60)
	require.InDelta(t, 0, lagging["events_processed"], 0)
	require.Nil(t, lagging["failing_event"])
	require.InDelta(t, 0, lagging["dead_letters"], 0)

	failing := byName["failing"]
	bad := f.events[2]
	require.Equal(t, "failing", failing["state"])
	require.Equal(t, "failing", failing["condition"])
	require.Equal(t, "0/0", failing["position"], "no C before the failing one")
	require.InDelta(t, 2, failing["lag_events"], 0)
	require.Greater(t, failing["lag_seconds"], 0.0)
	require.InDelta(t, 0, failing["events_processed"], 0)
	require.Equal(t, map[string]any{"id": bad.ID.String(), "type": "C", "stream_id": "order-1", "position": bad.Position.String()},
		failing["failing_event"])
	require.Equal(t, "cannot take C", failing["last_error"])
	require.InDelta(t, 1, failing["attempts"], 0)
	require.NotNil(t, failing["first_failure_at"])
	require.NotNil(t, failing["last_failure_at"])
	require.InDelta(t, 1, failing["dead_letters"], 0, "the failed one; the resolved one does not count")

	// Names pick projections, in the order given.
	res = settledStatus(t, f.env, "status", "lagging", "caught_up", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Len(t, got, 2)
	require.Equal(t, "lagging", got[0]["name"])
	require.Equal(t, "caught_up", got[1]["name"])
}

// TestStatusTable checks the table's columns and notes.
func TestStatusTable(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)

	res := settledStatus(t, f.env, "status")
	require.Equal(t, 0, res.code, res.stderr)
	lines := strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
	require.Len(t, lines, 4, res.stdout)
	require.Regexp(t, `^PROJECTION\s+STATE\s+POSITION\s+HEAD\s+LAG\s+LAG TIME\s+FAILING EVENT\s+DEAD LETTERS\s+NOTE$`, lines[0])
	head := regexp.QuoteMeta(f.events[4].Position.String())
	bad := f.events[2]
	require.Regexp(t, `^caught_up\s+caught_up\s+`+regexp.QuoteMeta(f.events[3].Position.String())+`\s+`+head+`\s+0\s+0s\s+-\s+0\s+-$`, lines[1])
	require.Regexp(t, `^failing\s+failing\s+0/0\s+`+head+`\s+2\s+\d+(\.\d)?(ms|s)\s+`+bad.ID.String()+` C at `+regexp.QuoteMeta(bad.Position.String())+
		`\s+1\s+attempt 1: cannot take C$`, lines[2])
	require.Regexp(t, `^lagging\s+working\s+0/0\s+`+head+`\s+3\s+\d+(\.\d)?(ms|s)\s+-\s+0\s+-$`, lines[3])

	res = settledStatus(t, f.env, "status", "nosuch", "lagging", "other")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, `no projection named "nosuch", "other" in this database; the registered projections are: caught_up, failing, lagging`)
}

// TestStatusHeldByHorizon: a projection whose events wait behind an open transaction says so.
func TestStatusHeldByHorizon(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	ctx := context.Background()
	// An open transaction with an id, older than the append below: the store cannot read past
	// it, so the new A waits.
	tx, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	_, err = store.Append(ctx, "order-2", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)

	// Other tests' transactions on the server may be older and hold the horizon first for a
	// while; this one stays open until the status names it.
	var res result
	require.Eventually(t, func() bool {
		res = runCLI(t, f.env, "status", "caught_up")
		return res.code == 0 && strings.Contains(res.stdout, fmt.Sprintf("waiting on pid %d ", pid))
	}, waitCLI, 20*time.Millisecond, "the status names this test's transaction")
	require.Regexp(t, `(?m)^caught_up\s+held\s+.*\s+0\s+0s\s+-\s+0\s+waiting on pid \d+ \(\S+\), open \S+ \(nudge horizon\)$`, res.stdout)

	var got []map[string]any
	var holder map[string]any
	require.Eventually(t, func() bool {
		res = runCLI(t, f.env, "status", "caught_up", "--json")
		got = nil
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &got) != nil || len(got) != 1 {
			return false
		}
		holder, _ = got[0]["holder"].(map[string]any)
		return holder != nil && holder["pid"] == float64(pid)
	}, waitCLI, 20*time.Millisecond, "the JSON status names this test's transaction")
	require.Equal(t, true, got[0]["held_by_horizon"])
	require.Equal(t, "held", got[0]["condition"])
	require.Greater(t, got[0]["oldest_open_transaction_seconds"], 0.0)
	require.InDelta(t, 0, got[0]["lag_events"], 0, "held, not lagging")
}

// TestStatusWatch: --watch prints table after table until its context ends, then exits 0.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr, wait := startCLI(t, ctx, f.env, "status", "failing", "--watch", "--interval", "100ms")
	require.Eventually(t, func() bool { return strings.Count(stdout.String(), "PROJECTION") >= 3 }, waitCLI, 10*time.Millisecond,
		"three tables; stderr: %s", stderr)
	cancel()
	require.Equal(t, 0, wait(waitCLI), stderr.String())
	out := stdout.String()
	require.NotContains(t, out, clearScreen, "not a terminal: no screen clearing")
	require.Regexp(t, `(?m)^--- \d{4}-\d\d-\d\dT`, out, "each table is stamped")
	require.GreaterOrEqual(t, strings.Count(out, "\nfailing "), 3)

	// With --json: one array per line.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr, wait = startCLI(t, ctx, f.env, "status", "--watch", "--json", "--interval", "100ms")
	require.Eventually(t, func() bool { return strings.Count(stdout.String(), "\n") >= 2 }, waitCLI, 10*time.Millisecond)
	cancel()
	require.Equal(t, 0, wait(waitCLI), stderr.String())
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var got []map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &got), line)
		require.Len(t, got, 3)
	}

	// A wrong name ends the watch at once.
	_, stderr, wait = startCLI(t, context.Background(), f.env, "status", "nosuch", "--watch")
	require.Equal(t, 1, wait(waitCLI))
	require.Contains(t, stderr.String(), `no projection named "nosuch"`)
}

func TestStatusBadInput(t *testing.T) {
	t.Parallel()
	db := map[string]string{envDatabaseURL: "postgres://localhost/x"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--interval", "1s"}, "--interval needs --watch"},
		{[]string{"status", "--watch", "--interval", "0s"}, "--interval 0s is too short; use at least 100ms"},
		{[]string{"status", "--watch", "--interval", "soon"}, `invalid value "soon" for flag --interval`},
		{[]string{"status", "--bogus"}, "unknown flag --bogus"},
		{[]string{"status", "no way"}, `invalid name "no way"`},
	} {
		res := runCLI(t, db, c.args...)
		require.Equal(t, 2, res.code, c.args)
		require.Contains(t, res.stderr, c.want, c.args)
	}

	// A database without nudge's tables.
	f := newFixture(t)
	res := runCLI(t, f.env, "--schema", "elsewhere", "status")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "check --db and --schema, or run 'nudge migrate'")

	// No projection registered yet.
	res = settledStatus(t, f.env, "status")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "No projections are registered")
	res = settledStatus(t, f.env, "status", "orders")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, `no projection named "orders": no projection is registered in this database`)
}

// TestStatusAndRebuildUnreachable: an unreachable database or broker is named, its password
// never printed.
func TestStatusAndRebuildUnreachable(t *testing.T) {
	t.Parallel()
	port := closedPort(t)
	const password = "s3cr3t-Pa55"
	url := "postgres://ops:" + password + "@127.0.0.1:" + port + "/nudge?sslmode=disable"
	for _, args := range [][]string{{"status"}, {"status", "--watch"}, {"rebuild", "orders"}, {"reset", "orders", "--no-wait"}} {
		res := runCLI(t, map[string]string{envDatabaseURL: url}, args...)
		require.Equal(t, 1, res.code, args)
		require.Contains(t, res.stderr, "cannot reach PostgreSQL at 127.0.0.1:"+port, args)
		require.NotContains(t, res.stderr+res.stdout, password, args)
	}

	// The database answers, the broker does not.
	f := newStatusFixture(t)
	amqpURL := "amqp://ops:" + password + "@127.0.0.1:" + closedPort(t) + "/"
	res := runCLI(t, f.env, "rebuild", "lagging", "--amqp", amqpURL)
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "cannot connect to RabbitMQ at amqp://ops:xxxxx@127.0.0.1:")
	require.NotContains(t, res.stderr+res.stdout, password)
}

// closedPort returns a local port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return strconv.Itoa(port)
}

func TestHumanDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", -time.Second: "0s", 340 * time.Millisecond: "340ms", 1249 * time.Millisecond: "1.2s",
		42*time.Second + 900*time.Millisecond: "42s", 3*time.Minute + 4*time.Second: "3m4s",
		2*time.Hour + 5*time.Minute + 9*time.Second: "2h5m", 76 * time.Hour: "3d4h",
	} {
		require.Equal(t, want, humanDuration(d), d.String())
	}
	require.Equal(t, "100%", percent(0, 0))
	require.Equal(t, "0%", percent(0, 10))
	require.Equal(t, "2.5%", percent(1, 40))
	require.Equal(t, "33%", percent(1, 3))
	require.Equal(t, "100%", percent(5, 5))
}

// TestStatusWithoutDeadLetterTable: without the dead-letter table the counts are unknown ("?",
// null), said once, and the rest is shown.
func TestStatusWithoutDeadLetterTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))
	p, err := projection.New("solo", projection.Config{},
		projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	env := map[string]string{envDatabaseURL: db.URL}

	res := settledStatus(t, env, "status")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^solo\s+caught_up\s+0/0\s+0/0\s+0\s+0s\s+-\s+\?\s+-$`, res.stdout)
	require.Equal(t, 1, strings.Count(res.stderr, "no dead-letter table"))

	res = settledStatus(t, env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Contains(t, got[0], "dead_letters")
	require.Nil(t, got[0]["dead_letters"])
}

// TestStatusVersions: a version built beside the active one, the active one, and a retired
// one each say where they stand, in the table and in --json.
func TestStatusVersions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, backend := appendToOrder(t, f, "A", "A")
	v1, v2 := ordersVersion(t, 1), ordersVersion(t, 2)
	// v1 is active and caught up; v2 is registered beside it and has not run.
	building := buildBeside(t, backend, v1, v2)

	out := settledStatus(t, f.env, "status")
	require.Equal(t, 0, out.code, out.stderr)
	require.Regexp(t, `(?m)^orders\s.*\s-$`, out.stdout, "the active version 1 needs no note")
	require.Regexp(t, `(?m)^orders\.v2\s.*v2 building beside v1 \(active\); cuts over once level`, out.stdout)

	out = settledStatus(t, f.env, "status", "--json")
	require.Equal(t, 0, out.code, out.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out.stdout), &got))
	byName := map[string]map[string]any{}
	for _, r := range got {
		byName[r["name"].(string)] = r
	}
	require.Equal(t, []any{1.0, 1.0, "active", nil}, []any{byName["orders"]["version"], byName["orders"]["active_version"],
		byName["orders"]["version_state"], byName["orders"]["retired_at"]})
	require.Equal(t, []any{2.0, 1.0, "building", nil}, []any{byName["orders.v2"]["version"], byName["orders.v2"]["active_version"],
		byName["orders.v2"]["version_state"], byName["orders.v2"]["retired_at"]})

	// v2 catches up and cuts over: v1 is retired, replaced by v2.
	_, err := building.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	st, err := building.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, st.VersionState, "v2 cut over in its catch-up")
	out = settledStatus(t, f.env, "status")
	require.Equal(t, 0, out.code, out.stderr)
	require.Regexp(t, `(?m)^orders\s.*v1 retired at \S+, replaced by v2$`, out.stdout)
	require.Regexp(t, `(?m)^orders\.v2\s.*v2 active$`, out.stdout)
}

// TestStatusPartitionedVersions: a partitioned version built beside a partitioned active one
// (2 partitions, then 4) is one folded row each, with where it stands; after the cut-over the
// old one is retired and the new one active, and --partitions lists the new one's 4 units.
func TestStatusPartitionedVersions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	appendToOrder(t, f, "A", "A", "A")
	_, backend := appendToOrder(t, f, "A")
	v1, v2 := ordersVersionPartitioned(t, 1, 2), ordersVersionPartitioned(t, 2, 4)
	building := buildBeside(t, backend, v1, v2)

	out := settledStatus(t, f.env, "status")
	require.Equal(t, 0, out.code, out.stderr)
	require.Regexp(t, `(?m)^orders\s.*\s2 partitions, no owner$`, out.stdout)
	require.Regexp(t, `(?m)^orders\.v2\s.*\s4 partitions, no owner; v2 building beside v1 \(active\); cuts over once level$`, out.stdout)

	_, err := building.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	out = settledStatus(t, f.env, "status", "--partitions")
	require.Equal(t, 0, out.code, out.stderr)
	require.Regexp(t, `(?m)^orders\s.*; v1 retired at \S+, replaced by v2$`, out.stdout)
	require.Regexp(t, `(?m)^orders\.v2\s+caught_up\s.*; v2 active$`, out.stdout)
	for k := range 4 {
		require.Regexp(t, fmt.Sprintf(`(?m)^  orders\.v2\.p%d\s+caught_up\s`, k), out.stdout)
	}
}

// settledStatus runs nudge status (args) until no projection waits on an open transaction: a
// transaction of another database in its commit window holds the read horizon below the newest
// events for a moment, and the status says so (conservatively: HeldByHorizon, with a lower head)
// with no holder left to name. It returns the first output without that note (table) or flag
// (--json).
func settledStatus(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	deadline := time.Now().Add(waitCLI)
	for {
		out := runCLI(t, env, args...)
		held := strings.Contains(out.stdout, "waiting on an open transaction") || strings.Contains(out.stdout, `"held_by_horizon":true`)
		if !held || time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ordersVersionPartitioned is version version of the projection orders, split into partitions
// (1: unpartitioned), whose table's stable name is orders (a view of orders_v<version>).
func ordersVersionPartitioned(t *testing.T, version, partitions int) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	p, err := projection.New("orders", projection.Config{Version: version, Partitions: partitions, Tables: []string{"orders"},
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table("orders")+` (n int)`)
			return err
		}}, projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil }))
	require.NoError(t, err)
	return p
}

// ordersVersion is version version of the projection orders, whose table's stable name is
// orders (a view of orders_v<version>).
func ordersVersion(t *testing.T, version int) *projection.Projection {
	t.Helper()
	return ordersVersionPartitioned(t, version, 1)
}

// buildBeside makes v1 active and caught up, and registers v2 beside it without running it; it
// returns v2's runner.
func buildBeside(t *testing.T, backend projection.Backend, v1, v2 *projection.Projection) *projection.Runner {
	t.Helper()
	ctx := context.Background()
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, v1)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	building, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, v2)
	require.NoError(t, err)
	require.NoError(t, building.Init(ctx))
	return building
}

func TestVersionNotesAndETA(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	require.Empty(t, versionNotes(projection.Status{Version: 1, ActiveVersion: 1, VersionState: projection.VersionActive}))
	require.Equal(t, []string{"v3 building; cuts over once level"}, versionNotes(projection.Status{Version: 3, VersionState: projection.VersionBuilding}))
	require.Equal(t, []string{"v1 retired"}, versionNotes(projection.Status{Version: 1, VersionState: projection.VersionRetired}))

	st := projection.Status{State: projection.StateRebuilding, RebuildStartedAt: now.Add(-10 * time.Second), EventsProcessed: 1000, LagEvents: 3000}
	eta, ok := rebuildETA(st, now)
	require.True(t, ok)
	require.Equal(t, 30*time.Second, eta, "3,000 events left at 100 events/s")
	st.EventsProcessed = 0
	_, ok = rebuildETA(st, now)
	require.False(t, ok, "no rate yet")
	st.State, st.EventsProcessed = projection.StateRunning, 1000
	_, ok = rebuildETA(st, now)
	require.False(t, ok, "not rebuilding")
}

// partitionedFixture is newFixture's database with the projection orders split into 4
// partitions, caught up over eight streams but failing in the partition of the stream
// order-bad, and the leases of two live workers, w-a and w-b, with one partition no one owns
// (its worker, w-c, left). One failed dead letter is recorded under the failing partition's
// unit name, beside newFixture's two under orders.
type partitionedFixture struct {
	*fixture
	status projection.Status // the runner's status of orders, its partitions folded
	bad    string            // the failing partition's unit name
	owners []string          // the owner of each partition, "" for the unowned one
}

func newPartitionedFixture(t *testing.T) *partitionedFixture {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	var last eventstore.AppendResult
	for _, s := range []string{"order-1", "order-2", "order-3", "order-4", "order-5", "order-6", "order-bad", "order-7", "order-8"} {
		last, err = store.Append(ctx, s, eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	storetest.Settle(t, store, last.Last())
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	orders, err := projection.New("orders", projection.Config{Partitions: 4}, projection.OnIdempotent("A",
		func(_ context.Context, e projection.Event[json.RawMessage]) error {
			if e.StreamID == "order-bad" {
				return errors.New("cannot take order-bad")
			}
			return nil
		}))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, orders)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	_, err = runner.CatchUp(ctx, "orders")
	require.ErrorIs(t, err, projection.ErrHandler)
	// Read it where no other database's commit window held the horizon (see settledStatus), as
	// the tests' settled CLI reads are.
	var st projection.Status
	for deadline := time.Now().Add(waitCLI); ; time.Sleep(10 * time.Millisecond) {
		st, err = runner.Status(ctx, "orders")
		require.NoError(t, err)
		if !st.HeldByHorizon || time.Now().After(deadline) {
			break
		}
	}
	require.NotEmpty(t, st.FailingPartition)
	_, err = f.store.Add(ctx, deadletter.Entry{Projection: st.FailingPartition, MessageUUID: "m-part", Payload: []byte(`{}`),
		Error: "cannot take order-bad", Attempts: 1, At: time.Now()})
	require.NoError(t, err)
	return &partitionedFixture{fixture: f, status: st, bad: st.FailingPartition, owners: leaseOrders(t, f)}
}

// leaseOrders lets three workers share orders' 4 partitions, stops their renewals (their
// leases stay live for a long TTL), lets w-c leave, and returns each partition's owner.
func leaseOrders(t *testing.T, f *fixture) []string {
	t.Helper()
	ctx := context.Background()
	members := map[string]*lease.Member{}
	var stops []func()
	for _, owner := range []string{"w-a", "w-b", "w-c"} {
		m, err := lease.New(f.db.Pool, lease.Config{Group: "orders", Partitions: 4, Owner: owner, TTL: time.Hour,
			Renew: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(runCtx) }()
		stops = append(stops, func() {
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
		})
		members[owner] = m
	}
	// Three members of 4 partitions: w-a holds 2, w-b and w-c one each.
	require.Eventually(t, func() bool {
		return len(members["w-a"].Owned()) == 2 && len(members["w-b"].Owned()) == 1 && len(members["w-c"].Owned()) == 1
	}, waitCLI, 10*time.Millisecond, "the three workers share the partitions")
	for _, stop := range stops {
		stop()
	}
	require.NoError(t, members["w-c"].Close(ctx))
	ls, err := lease.Leases(ctx, f.db.Pool, "", "orders", 4)
	require.NoError(t, err)
	owners := make([]string, len(ls))
	for k, l := range ls {
		owners[k] = l.Owner
	}
	require.ElementsMatch(t, []string{"w-a", "w-a", "w-b", ""}, owners)
	return owners
}

// TestStatusPartitions: a partitioned projection is one folded line whose note counts its
// partitions and owners and names the failing partition; --partitions adds a line per
// partition with its owner; --json has the partitions and their owners.
func TestStatusPartitions(t *testing.T) {
	t.Parallel()
	f := newPartitionedFixture(t)
	st := f.status
	head := regexp.QuoteMeta(st.Head.String())
	e := st.FailingEvent
	require.NotNil(t, e)
	failing := regexp.QuoteMeta(fmt.Sprintf("%s A at %s", e.ID, e.Position))

	res := settledStatus(t, f.env, "status")
	require.Equal(t, 0, res.code, res.stderr)
	lines := strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
	require.Len(t, lines, 2, "one line for the 4 partitions: %s", res.stdout)
	require.Regexp(t, `^orders\s+failing\s+`+regexp.QuoteMeta(st.Position.String())+`\s+`+head+`\s+`+strconv.FormatInt(st.LagEvents, 10)+
		`\s+\S+\s+`+failing+`\s+3\s+4 partitions, 2 owners, 1 unowned; `+regexp.QuoteMeta(f.bad)+` attempt 1: cannot take order-bad$`, lines[1])

	res = settledStatus(t, f.env, "status", "--partitions")
	require.Equal(t, 0, res.code, res.stderr)
	lines = strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
	require.Len(t, lines, 6, res.stdout)
	require.Regexp(t, `^orders\s+failing\s`, lines[1])
	for k, p := range st.Partitions {
		owner := "owner " + f.owners[k]
		if f.owners[k] == "" {
			owner = "unowned"
		}
		want := `^  ` + regexp.QuoteMeta(fmt.Sprintf("orders.p%d", k)) + `\s+caught_up\s+` + regexp.QuoteMeta(p.Position.String()) +
			`\s+\S+\s+0\s+0s\s+-\s+0\s+` + owner + `$`
		if p.Name == f.bad {
			want = `^  ` + regexp.QuoteMeta(f.bad) + `\s+failing\s+` + regexp.QuoteMeta(p.Position.String()) + `\s+\S+\s+[1-9]\d*\s+\S+\s+` + failing +
				`\s+1\s+` + owner + `; attempt 1: cannot take order-bad$`
		}
		require.Regexp(t, want, lines[2+k])
	}

	// A partition's unit name shows it alone.
	res = settledStatus(t, f.env, "status", "orders.p1")
	require.Equal(t, 0, res.code, res.stderr)
	lines = strings.Split(strings.TrimRight(res.stdout, "\n"), "\n")
	require.Len(t, lines, 2, res.stdout)
	require.Regexp(t, `^orders\.p1\s.*\s(owner `+f.owners[1]+`|unowned)(; .*)?$`, lines[1])

	res = settledStatus(t, f.env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got), res.stdout)
	require.Len(t, got, 1)
	o := got[0]
	require.Equal(t, []any{"orders", "failing", 4.0, []any{"w-a", "w-b"}, f.bad, 3.0, st.Position.String(), "", nil, nil},
		[]any{o["name"], o["condition"], o["partition_count"], o["owners"], o["failing_partition"], o["dead_letters"], o["position"],
			o["partition_of"], o["partition"], o["owner"]})
	parts := o["partitions"].([]any)
	require.Len(t, parts, 4)
	for k, raw := range parts {
		p := raw.(map[string]any)
		name := fmt.Sprintf("orders.p%d", k)
		require.Equal(t, []any{name, "orders", float64(k), 4.0, st.Partitions[k].Position.String(), nil, nil},
			[]any{p["name"], p["partition_of"], p["partition"], p["partition_count"], p["position"], p["partitions"], p["owners"]})
		if f.owners[k] == "" {
			require.Nil(t, p["owner"], "unowned")
			require.Nil(t, p["lease_expires_at"])
		} else {
			require.Equal(t, f.owners[k], p["owner"])
			require.NotNil(t, p["lease_expires_at"])
		}
		wantDead, wantCondition := 0.0, "caught_up"
		if name == f.bad {
			wantDead, wantCondition = 1, "failing"
		}
		require.Equal(t, []any{wantDead, wantCondition}, []any{p["dead_letters"], p["condition"]}, name)
	}
}

// TestStatusPartitionsWithoutLeaseTable: without the lease table the owners are unknown ("?",
// null), said once, and the rest is shown.
func TestStatusPartitionsWithoutLeaseTable(t *testing.T) {
	t.Parallel()
	f := newPartitionedFixture(t)
	_, err := f.db.Pool.Exec(context.Background(), `DROP TABLE nudge_partition_leases`)
	require.NoError(t, err)

	res := settledStatus(t, f.env, "status", "--partitions")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, 1, strings.Count(res.stderr, "no lease table"), res.stderr)
	require.Regexp(t, `(?m)^orders\s+failing\s.*\s3\s+4 partitions; `+regexp.QuoteMeta(f.bad)+` attempt 1`, res.stdout)
	require.Regexp(t, `(?m)^  orders\.p\d\s.*\sowner \?$`, res.stdout)

	res = settledStatus(t, f.env, "status", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got), res.stdout)
	require.Contains(t, got[0], "owners")
	require.Nil(t, got[0]["owners"], "unknown")
}

// TestStatusOwnerIsTerminalSafe: an owner id comes from the database; the table escapes it.
func TestStatusOwnerIsTerminalSafe(t *testing.T) {
	t.Parallel()
	part := projection.Status{Name: "orders.p0", PartitionOf: "orders", Partition: eventstore.Partition{Index: 0, Count: 2}}
	other := part
	other.Name, other.Partition.Index = "orders.p1", 1
	rows := []statusRow{newStatusRow(projection.FoldPartitions("orders", []projection.Status{part, other}), map[string]int{},
		[]lease.Lease{{Partition: 0, Owner: "evil\x1b[2J"}, {Partition: 1}})}
	var out bytes.Buffer
	require.NoError(t, writeStatusTable(&out, rows, true))
	require.NotContains(t, out.String(), "\x1b")
	require.Contains(t, out.String(), `owner evil\x1b[2J`)
	require.Regexp(t, `(?m)^orders\s.*\s2 partitions, 1 owner, 1 unowned$`, out.String())
	require.Regexp(t, `(?m)^  orders\.p1\s.*\sunowned$`, out.String())
}

// TestStatusNamesParkedStream: a projection with parked streams names the oldest in its note
// (stream, since when, event, error), as a failing projection names its event, with the text
// from the database escaped for the terminal; 'parked list' shows the parked event's id.
func TestStatusNamesParkedStream(t *testing.T) {
	t.Parallel()
	f := parkedFixture(t)
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	parked, err := backend.ParkedStreams(context.Background(), pjpg.ParkedFilter{Projection: "tickets", StreamID: "t-bad"})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	ps := parked[0]

	res := settledStatus(t, f.env, "status", "tickets")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, fmt.Sprintf("2 parked streams, the oldest: t-bad since %s, event %s T at %s: value too long \\x1b[2J (nudge parked list tickets)",
		ps.ParkedAt.UTC().Format(time.RFC3339), ps.Event.ID, ps.Event.Position))
	require.NotContains(t, res.stdout, "\x1b", "escapes are shown, not sent")

	res = runCLI(t, f.env, "parked", "list", "tickets")
	require.Equal(t, 0, res.code, res.stderr)
	require.Regexp(t, `(?m)^PROJECTION\s+STREAM\s+PARKED AT\s+ATTEMPTS\s+HELD\s+EVENT ID\s+EVENT TYPE\s+VERSION\s+POSITION\s+ERROR$`, res.stdout)
	require.Regexp(t, `(?m)^tickets\s+t-bad\s+\S+\s+\d+\s+1\s+`+ps.Event.ID.String()+`\s+T\s+1\s+`+regexp.QuoteMeta(ps.Event.Position.String())+`\s`, res.stdout)
}
