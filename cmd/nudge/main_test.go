package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	chamqp "github.com/nudgeworks/nudge/channel/amqp"
	chpg "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// result is one run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

// waitCLI bounds every wait of these tests (a command's run, a condition): an upper bound for
// a failure on a busy machine, never the expected time.
var waitCLI = testwait.For(2 * time.Minute)

// runCLI runs the CLI with env as its whole environment.
func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitCLI)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr, func(k string) string { return env[k] })
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// fixture is a migrated database of the test's own with three dead letters:
//
//	1: orders, failing on event failingOrders (type OrderBad)
//	2: orders, failing on another event (type OrderBad)
//	3: invoices, an invalid trigger (no failing event)
type fixture struct {
	db     *pgtest.DB
	env    map[string]string
	store  *dlpg.Store
	events [2]uuid.UUID
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := pgtest.New(t)
	f := &fixture{db: db, env: map[string]string{envDatabaseURL: db.URL, "USER": "tester"}}
	res := runCLI(t, f.env, "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "migrated: dead letters")

	store, err := dlpg.New(db.Pool, dlpg.Config{})
	require.NoError(t, err)
	f.store = store
	ctx := context.Background()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range f.events {
		f.events[i] = uuid.New()
		_, err := store.Add(ctx, deadletter.Entry{
			Projection: "orders", MessageUUID: uuid.NewString(), Payload: []byte(`{"projection":"orders"}`),
			Metadata: map[string]string{"k": "v"},
			Error:    "handler failed: " + strings.Repeat("boom ", 30),
			FailingEvent: &eventstore.EventRef{ID: f.events[i], Type: "OrderBad", StreamID: fmt.Sprintf("order-%d", i+1),
				Position: eventstore.Position{TransactionID: 700, GlobalPosition: int64(40 + i)}},
			Attempts: 3, At: at.Add(time.Duration(i) * time.Minute),
		})
		require.NoError(t, err)
	}
	_, err = store.Add(ctx, deadletter.Entry{Projection: "invoices", MessageUUID: "m-3", Payload: []byte{0xff, 0x00},
		Error: "trigger does not decode", At: at})
	require.NoError(t, err)
	return f
}

func TestList(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	res := runCLI(t, f.env, "deadletter", "list")
	require.Equal(t, 0, res.code, res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 4, res.stdout)
	require.Regexp(t, `^ID\s+PROJECTION\s+STATUS\s+COUNT\s+ATTEMPTS\s+EVENT TYPE\s+EVENT ID\s+STREAM\s+POSITION\s+LAST FAILURE\s+ERROR$`, lines[0])
	require.Regexp(t, `^1\s+orders\s+failed\s+1\s+3\s+OrderBad\s+`+f.events[0].String()+`\s+order-1\s+700/40\s+2025-03-01T12:00:00Z\s+handler failed: boom`, lines[1])
	require.True(t, strings.HasSuffix(lines[1], "…"), "a long error is truncated: %q", lines[1])
	require.Regexp(t, `^3\s+invoices\s+failed\s+1\s+1\s+-\s+-\s+-\s+-\s+`, lines[3])

	res = runCLI(t, f.env, "deadletter", "list", "--projection", "invoices", "--status", "failed")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, 2, strings.Count(res.stdout, "\n"), res.stdout)

	// Global flags after the command work too.
	res = runCLI(t, map[string]string{}, "deadletter", "list", "--status=resolved", "--db", f.db.URL)
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "No dead letters match.\n", res.stdout)

	res = runCLI(t, f.env, "deadletter", "list", "--json", "--limit", "2")
	require.Equal(t, 0, res.code, res.stderr)
	var recs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &recs))
	require.Len(t, recs, 2)
	require.InDelta(t, 1, recs[0]["id"], 0)
	require.Equal(t, "orders", recs[0]["projection"])
	require.Equal(t, "failed", recs[0]["status"])
	require.Equal(t, map[string]any{"id": f.events[0].String(), "type": "OrderBad", "stream_id": "order-1", "position": "700/40"},
		recs[0]["failing_event"], "the failing event has the shape of nudge status's")
	require.Contains(t, res.stderr, "showing the first 2")
}

func TestShow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	res := runCLI(t, f.env, "deadletter", "show", "1")
	require.Equal(t, 0, res.code, res.stderr)
	for _, want := range []string{
		"id:", "projection:             orders", "status:                 failed", "attempts:               3",
		"failing event id:       " + f.events[0].String(), "failing event stream:   order-1", "failing event position: 700/40",
		`payload:                {"projection":"orders"}`, "metadata k:             v", "replays:                0",
	} {
		require.Contains(t, res.stdout, want)
	}

	res = runCLI(t, f.env, "deadletter", "show", "3", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rec))
	require.Nil(t, rec["failing_event"])
	require.Equal(t, "/wA=", rec["payload_base64"], "a payload that is not UTF-8 is base64")
	require.Equal(t, "trigger does not decode", rec["error"])
}

func TestReplayPostgresChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	ch, err := chpg.New(f.db.Pool, chpg.Config{PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })

	// Before any worker ran here: refused, nothing marked.
	res := runCLI(t, f.env, "deadletter", "replay", "--projection", "orders", "--channel", "postgres")
	require.Equal(t, 1, res.code, res.stdout)
	require.Contains(t, res.stderr, "the postgres channel has no tables in this database")
	require.NoError(t, ch.Declare(ctx, "invoices"))
	res = runCLI(t, f.env, "deadletter", "replay", "--projection", "orders", "--channel", "postgres")
	require.Equal(t, 1, res.code, res.stdout)
	require.Contains(t, res.stderr, "no worker of projection orders has declared its subscription on the postgres channel in this database")
	require.Contains(t, res.stderr, "Nothing was replayed")
	rec, err := f.store.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusFailed, rec.Status)

	require.NoError(t, ch.Declare(ctx, "orders"))

	res = runCLI(t, f.env, "deadletter", "replay", "--projection", "orders", "--by", "alice", "--channel", "postgres")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "replayed 2 dead letter(s); triggered orders on the postgres channel\n", res.stdout)

	for _, id := range []int64{1, 2} {
		rec, err := f.store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, deadletter.StatusReplayed, rec.Status)
		require.Equal(t, "alice", rec.ReplayedBy)
	}
	rec, err = f.store.Get(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusFailed, rec.Status, "another projection's record is left alone")

	var queued int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM nudge_channel_triggers`).Scan(&queued))
	require.Equal(t, 1, queued, "one trigger for the projection, however many records")

	sub, topic, err := ch.Subscriber("orders")
	require.NoError(t, err)
	subCtx, cancel := context.WithTimeout(ctx, waitCLI)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(t, err)
	select {
	case msg := <-msgs:
		tr, err := trigger.FromMessage(msg)
		require.NoError(t, err)
		msg.Ack()
		require.Equal(t, "orders", tr.Projection)
		require.Equal(t, trigger.ReasonReplay, tr.Reason)
	case <-subCtx.Done():
		t.Fatal("no trigger arrived on the postgres channel")
	}

	// By IDs: a resolved record is left alone; an unknown one fails before anything changes.
	require.NoError(t, f.store.Resolve(ctx, 1, "bob", "", time.Time{}))
	res = runCLI(t, f.env, "--channel", "postgres", "deadletter", "replay", "1", "2")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "replayed 1 dead letter(s), left 1 resolved one(s) alone")

	res = runCLI(t, f.env, "--channel", "postgres", "deadletter", "replay", "2", "99")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "no dead letter with ID 99")

	res = runCLI(t, f.env, "--channel", "postgres", "deadletter", "replay", "2", "--all")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "exactly one of")
}

func TestReplayAMQPChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	amqpEnv := amqptest.New(t)
	ctx := context.Background()

	f.env[envAMQPURL] = amqpEnv.URL
	f.env[envAMQPPrefix] = amqpEnv.Prefix
	// The projections' workers have declared their queues.
	ch, err := chamqp.New(ctx, chamqp.Config{URL: amqpEnv.URL, Prefix: amqpEnv.Prefix, ConnectionName: amqpEnv.ConnectionName,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Declare(ctx, "orders", "invoices"))

	res := runCLI(t, f.env, "deadletter", "replay", "--all")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "replayed 3 dead letter(s); triggered invoices, orders on the amqp channel\n", res.stdout)

	sub, topic, err := ch.Subscriber("orders")
	require.NoError(t, err)
	subCtx, cancel := context.WithTimeout(ctx, waitCLI)
	defer cancel()
	msgs, err := sub.Subscribe(subCtx, topic)
	require.NoError(t, err)
	select {
	case msg := <-msgs:
		tr, err := trigger.FromMessage(msg)
		require.NoError(t, err)
		msg.Ack()
		require.Equal(t, "orders", tr.Projection)
		require.Equal(t, trigger.ReasonReplay, tr.Reason)
	case <-subCtx.Done():
		t.Fatal("no trigger arrived on the AMQP channel")
	}
}

// TestNoOrphanQueues: requests to a projection no worker consumes — under a forgotten
// prefix, or the relay's name — fail, naming the channel and its prefix, and leave no queue on
// the broker that would collect every trigger forever; a refused replay marks nothing.
func TestNoOrphanQueues(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	amqpEnv := amqptest.New(t)
	ctx := context.Background()
	f.env[envAMQPURL] = amqpEnv.URL
	f.env[envAMQPPrefix] = amqpEnv.Prefix
	queue := func(prefix, name string) string { return prefix + channel.TriggerTopic + "_" + name }

	// No worker has declared anything yet.
	res := runCLI(t, f.env, "deadletter", "replay", "--projection", "failing")
	require.Equal(t, 1, res.code, res.stdout)
	require.Contains(t, res.stderr, fmt.Sprintf("no worker of projection failing consumes from the amqp channel with prefix %q: "+
		"RabbitMQ has no queue %s", amqpEnv.Prefix, queue(amqpEnv.Prefix, "failing")))
	require.Contains(t, res.stderr, "--amqp-prefix")
	require.Contains(t, res.stderr, "Nothing was replayed")
	recs, err := f.store.List(ctx, deadletter.Filter{Projection: "failing", Status: []deadletter.Status{deadletter.StatusFailed}})
	require.NoError(t, err)
	require.Len(t, recs, 1, "the record is still failed")
	require.Zero(t, recs[0].Replays)

	for _, args := range [][]string{
		{"rebuild", "lagging", "--no-wait"},
		{"skip", "failing", "--event", f.events[2].ID.String(), "--reason", "bad"},
	} {
		res := runCLI(t, f.env, args...)
		require.Equal(t, 1, res.code, args)
		require.Contains(t, res.stderr, "consumes from the amqp channel with prefix "+strconv.Quote(amqpEnv.Prefix), args)
	}

	// The workers run under the prefix; the operator forgot it.
	ch, err := chamqp.New(ctx, chamqp.Config{URL: amqpEnv.URL, Prefix: amqpEnv.Prefix, ConnectionName: amqpEnv.ConnectionName,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Declare(ctx, "failing", "lagging", "caught_up"))
	wrong := amqpEnv.Prefix + "other."
	res = runCLI(t, f.env, "rebuild", "lagging", "--no-wait", "--amqp-prefix", wrong)
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, fmt.Sprintf("prefix %q: RabbitMQ has no queue %s", wrong, queue(wrong, "lagging")))

	// The relay is no projection: refused before anything is sent.
	for _, args := range [][]string{
		{"rebuild", relay.NameDefault},
		{"skip", relay.NameDefault, "--event", f.events[0].ID.String(), "--reason", "x"},
		{"skip", relay.NameDefault, "--event", f.events[0].ID.String(), "--reason", "x", "--direct"},
	} {
		res := runCLI(t, f.env, args...)
		require.Equal(t, 2, res.code, args)
		require.Contains(t, res.stderr, "nudge-relay is the trigger relay, not a projection", args)
	}

	for _, q := range []string{queue(amqpEnv.Prefix, relay.NameDefault), queue(wrong, "lagging")} {
		require.False(t, amqpEnv.QueueExists(t, q), "no orphan queue %s", q)
	}
	res = runCLI(t, f.env, "rebuild", "lagging", "--no-wait")
	require.Equal(t, 0, res.code, res.stderr)
	res = runCLI(t, f.env, "deadletter", "replay", "--projection", "failing")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "replayed 1 dead letter(s); triggered failing on the amqp channel\n", res.stdout)
}

func TestResolveAndPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()

	res := runCLI(t, f.env, "deadletter", "resolve", "2", "--note", "fixed upstream")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "resolved dead letter 2 (projection orders)\n", res.stdout)
	rec, err := f.store.Get(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusResolved, rec.Status)
	require.Equal(t, "tester (nudge cli)", rec.ResolvedBy)
	require.Equal(t, "fixed upstream", rec.ResolveNote)

	res = runCLI(t, f.env, "deadletter", "resolve", "2", "--by", "carol")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "already resolved by tester (nudge cli)")

	// The records failed on 2025-03-01, longer ago than the default 720h.
	res = runCLI(t, f.env, "deadletter", "purge")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "purged 1 resolved dead letter(s) whose last failure is older than 720h0m0s")
	_, err = f.store.Get(ctx, 2)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
	for _, id := range []int64{1, 3} {
		_, err := f.store.Get(ctx, id)
		require.NoError(t, err, "unresolved records stay")
	}

	res = runCLI(t, f.env, "deadletter", "purge", "--include-unresolved", "--older-than", "0s")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "purged 2 any-status dead letter(s)")
}

func TestSkip(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()

	// A projection reading OrderPlaced and OrderBad that fails on OrderBad. An event of a type it
	// does not read sits between its position and the failing event.
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	appended, err := store.Append(ctx, "order-1", eventstore.Any,
		eventstore.EventData{Type: "OrderPlaced", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "Unrelated", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "OrderBad", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "OrderPlaced", Payload: json.RawMessage(`{}`)},
	)
	require.NoError(t, err)
	evs := appended.Events
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	ok := func(context.Context, projection.Event[json.RawMessage]) error { return nil }
	p, err := projection.New("orders", projection.Config{},
		projection.OnIdempotent("OrderPlaced", ok),
		projection.OnIdempotent("OrderBad", func(context.Context, projection.Event[json.RawMessage]) error { return errors.New("cannot") }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	require.Eventually(t, func() bool {
		_, err := runner.CatchUp(ctx, "orders")
		return errors.Is(err, projection.ErrHandler)
	}, waitCLI, 20*time.Millisecond, "the events become readable and the projection fails")
	st, err := runner.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, evs[2].ID, st.FailingEvent.ID)

	// The wrong event: refused with the runner's reason.
	res := runCLI(t, f.env, "skip", "--direct", "orders", "--event", evs[3].ID.String(), "--reason", "bad data")
	require.Equal(t, 1, res.code, res.stdout)
	require.Contains(t, res.stderr, "skip refused")
	require.Contains(t, res.stderr, "is failing on event "+evs[2].ID.String())

	res = runCLI(t, f.env, "skip", "--direct", "nosuch", "--event", evs[2].ID.String(), "--reason", "x")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "no projection named nosuch")

	res = runCLI(t, f.env, "skip", "orders", "--event", evs[2].ID.String())
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "--reason")

	// The failing event: skipped through Runner.Skip; its dead letter is resolved, the
	// projection's others are not.
	dead, err := f.store.Add(ctx, deadletter.Entry{Projection: "orders", MessageUUID: "m-skip", Error: "cannot", At: time.Now(),
		FailingEvent: &eventstore.EventRef{ID: evs[2].ID, Type: evs[2].Type, StreamID: evs[2].StreamID, Position: evs[2].Position}})
	require.NoError(t, err)
	res = runCLI(t, f.env, "skip", "--direct", "orders", "--event", evs[2].ID.String(), "--reason", "bad data", "--by", "dave")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, fmt.Sprintf("skipped event %s (type OrderBad, stream %q, position %s)", evs[2].ID, evs[2].StreamID, evs[2].Position))
	require.Contains(t, res.stdout, "state running, position "+evs[2].Position.String())
	require.Contains(t, res.stdout, fmt.Sprintf("resolved dead letter %d (it failed on the skipped event), so no worker replays it", dead.ID))
	require.Contains(t, res.stderr, "on-skip hook")
	rec, err := f.store.Get(ctx, dead.ID)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusResolved, rec.Status)
	require.Equal(t, "dave", rec.ResolvedBy)
	require.Equal(t, "event skipped: bad data", rec.ResolveNote)
	for _, id := range []int64{1, 2} {
		rec, err := f.store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, deadletter.StatusFailed, rec.Status, "a dead letter on another event stays")
	}

	st, err = runner.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, evs[2].Position, st.Position)
	require.Nil(t, st.FailingEvent)
	require.NotNil(t, st.LastSkip)
	require.Equal(t, evs[2].ID, st.LastSkip.Event.ID)
	require.Equal(t, "dave", st.LastSkip.By)
	require.Equal(t, "bad data", st.LastSkip.Reason)
	require.False(t, st.LastSkip.Forced)
}

func TestBadInput(t *testing.T) {
	t.Parallel()

	res := runCLI(t, nil, "frobnicate")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, `unknown command "frobnicate"`)

	res = runCLI(t, nil, "deadletter", "list")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "NUDGE_DATABASE_URL")

	res = runCLI(t, nil, "deadletter", "list", "--status", "broken", "--db", "postgres://localhost/x")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, `--status "broken" is not a status; use failed, replayed or resolved`)

	res = runCLI(t, nil, "deadletter", "show", "abc", "--db", "postgres://localhost/x")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, `"abc" is not a dead-letter ID`)

	res = runCLI(t, nil, "deadletter", "list", "--bogus")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "unknown flag --bogus")

	res = runCLI(t, nil, "--channel", "kafka", "deadletter", "list")
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "use amqp or postgres")
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: take a free one and close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())

	const password = "s3cr3t-Pa55"
	url := "postgres://ops:" + password + "@127.0.0.1:" + strconv.Itoa(port) + "/nudge?sslmode=disable"
	res := runCLI(t, map[string]string{envDatabaseURL: url}, "deadletter", "list")
	require.Equal(t, 1, res.code)
	require.Contains(t, res.stderr, "cannot reach PostgreSQL at 127.0.0.1:"+strconv.Itoa(port))
	require.Contains(t, res.stderr, "NUDGE_DATABASE_URL")
	require.NotContains(t, res.stderr+res.stdout, password)

	res = runCLI(t, nil, "--db", "postgres://ops:"+password+"@[bad", "migrate")
	require.Equal(t, 2, res.code)
	require.NotContains(t, res.stderr+res.stdout, password)
}

func TestUnknownID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, args := range [][]string{{"deadletter", "show", "42"}, {"deadletter", "resolve", "42"}} {
		res := runCLI(t, f.env, args...)
		require.Equal(t, 1, res.code, args)
		require.Contains(t, res.stderr, "no dead letter with ID 42; list the records to find their IDs", args)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, "help")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "deadletter replay")
	require.Contains(t, res.stdout, "NUDGE_DATABASE_URL")

	res = runCLI(t, nil, "skip", "-h")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "Usage: nudge skip PROJECTION")
	require.Contains(t, res.stdout, "the on-skip hook does NOT run")
	require.Contains(t, res.stdout, "  --reason TEXT")

	res = runCLI(t, map[string]string{envDatabaseURL: "postgres://u:hidden@h/db"}, "help", "deadletter", "list")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "  --status status")
	require.NotContains(t, res.stdout, "hidden", "usage never shows a URL from the environment")

	res = runCLI(t, nil)
	require.Equal(t, 2, res.code)
	require.Contains(t, res.stderr, "no command given")
}

// TestSkipThroughWorker: without --direct the request goes to the projection's worker through
// the channel, and the projection's own on-skip hook runs.
func TestSkipThroughWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	store, err := espg.New(f.db.Pool, espg.Config{})
	require.NoError(t, err)
	appended, err := store.Append(ctx, "order-9", eventstore.Any,
		eventstore.EventData{Type: "OrderPlaced", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "OrderBad", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "OrderPlaced", Payload: json.RawMessage(`{}`)},
	)
	require.NoError(t, err)
	bad := appended.Events[1]
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	var hooked atomic.Value
	p, err := projection.New("orders", projection.Config{
		SkipFunc: func(_ context.Context, sp projection.SkipParams) error { hooked.Store(sp.Event.ID); return nil },
	},
		projection.OnIdempotent("OrderPlaced", func(context.Context, projection.Event[json.RawMessage]) error { return nil }),
		projection.OnIdempotent("OrderBad", func(context.Context, projection.Event[json.RawMessage]) error { return errors.New("cannot") }))
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	ch, err := chpg.New(f.db.NewPool(t, 10), chpg.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: logger, SafetyNetInterval: 100 * time.Millisecond,
		Retry: retry.Policy{MaxAttempts: 1}, DeadLetters: dlmemory.New(dlmemory.Config{})})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done); require.NoError(t, ch.Close()) }()
	require.Eventually(t, func() bool {
		st, err := runner.Status(ctx, "orders")
		require.NoError(t, err)
		return st.FailingEvent != nil && st.FailingEvent.ID == bad.ID
	}, waitCLI, 10*time.Millisecond, "the worker runs the projection into its failing event")

	dead, err := f.store.Add(ctx, deadletter.Entry{Projection: "orders", MessageUUID: "m-skip", Error: "cannot", At: time.Now(),
		FailingEvent: &eventstore.EventRef{ID: bad.ID, Type: bad.Type, StreamID: bad.StreamID, Position: bad.Position}})
	require.NoError(t, err)
	_, err = f.store.MarkReplayed(ctx, []int64{dead.ID}, "ops", time.Time{})
	require.NoError(t, err)

	res := runCLI(t, f.env, "--channel", "postgres", "skip", "orders", "--event", bad.ID.String(), "--reason", "bad data", "--by", "dave")
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stdout, "by its worker (on-skip hook included)")
	require.Contains(t, res.stdout, fmt.Sprintf("resolved dead letter %d", dead.ID))
	rec, err := f.store.Get(ctx, dead.ID)
	require.NoError(t, err)
	require.Equal(t, deadletter.StatusResolved, rec.Status, "a replayed dead letter on the event is resolved too")
	require.Equal(t, bad.ID, hooked.Load(), "the projection's own on-skip hook ran")
	st, err := runner.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, "dave", st.LastSkip.By)
	require.NotEqual(t, projection.StateFailing, st.State)
}

// goWords are names of Go config fields and arguments that CLI messages must not show: the
// user gave flags.
var goWords = regexp.MustCompile(`Config\.|Options\.?|Filter\.|Replay's by|Resolve's by|\bForce\b|\bSchema\b|Prefix\b|StartupTimeout`)

// TestErrorsSpeakOfFlags: mistakes on the command line, including those a library refuses,
// are reported with the flag to change.
func TestErrorsSpeakOfFlags(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	amqpURL := amqptest.URL()
	long := strings.Repeat("x", trigger.MaxSize)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--schema", "Bad_schema", "status"}, 2, `--schema "Bad_schema" is not a schema name nudge uses`},
		{[]string{"deadletter", "list", "--schema", "Bad_schema"}, 2, `--schema "Bad_schema"`},
		{[]string{"migrate", "--schema", "1x"}, 2, `--schema "1x"`},
		{[]string{"horizon", "--schema", "x y"}, 2, `--schema "x y"`},
		{[]string{"deadletter", "replay", "--all", "--amqp", amqpURL, "--amqp-prefix", "a b"}, 2,
			`--amqp-prefix "a b" may only hold letters, digits`},
		{[]string{"deadletter", "replay", "--all", "--amqp", amqpURL, "--amqp-prefix", "amq.x"}, 2,
			`--amqp-prefix "amq.x" starts with "amq.", which RabbitMQ reserves`},
		{[]string{"deadletter", "replay", "--all", "--amqp", "http://guest:secret@localhost/"}, 2,
			"--amqp http://guest:xxxxx@localhost/ is not an AMQP URL"},
		{[]string{"deadletter", "replay", "--all", "--amqp", "amqp://guest:secret@host:port/"}, 2, "--amqp is not a valid URL"},
		{[]string{"skip", "failing", "--event", f.events[2].ID.String(), "--reason", long}, 2,
			"--reason and --by are too long for a request to the worker"},
		{[]string{"skip", "failing", "--event", f.events[4].ID.String(), "--reason", "x", "--direct"}, 1,
			"pass --force to skip another event"},
		{[]string{"deadletter", "replay", "--all", "--channel", "postgres", "--by", "  "}, 1, "the postgres channel has no tables"},
		{[]string{"deadletter", "resolve", "1", "--by", " "}, 0, "resolved dead letter 1"},
	} {
		res := runCLI(t, f.env, tc.args...)
		out := res.stderr + res.stdout
		require.Equal(t, tc.code, res.code, "%v: %s", tc.args, out)
		require.Contains(t, out, tc.want, tc.args)
		require.NotRegexp(t, goWords, out, tc.args)
	}
}

// TestMigrateDoesWhatItSays: the help of migrate names every table and view it creates, and
// the README does not promise more.
func TestMigrateDoesWhatItSays(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	res := runCLI(t, map[string]string{envDatabaseURL: db.URL}, "migrate")
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, "migrated: event store\nmigrated: projections\nmigrated: dead letters\n", res.stdout)

	rows, err := db.Pool.Query(context.Background(),
		`SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`)
	require.NoError(t, err)
	created, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"nudge_dead_letters", "nudge_events", "nudge_partition_leases", "nudge_partition_members", "nudge_projection_conditions", "nudge_projection_park_actions", "nudge_projection_parked", "nudge_projection_skips", "nudge_projection_versions",
		"nudge_projections", "nudge_schema_migrations", "nudge_streams"}, created)

	help := runCLI(t, nil, "help", "migrate")
	require.Equal(t, 0, help.code)
	for _, name := range created {
		require.Contains(t, help.stdout, name, "migrate's help names what it creates")
	}
	require.Contains(t, help.stdout, "not the\nPostgreSQL channel's tables")

	var line string
	for _, l := range strings.Split(readFile(t, "../../README.md"), "\n") {
		if strings.HasPrefix(l, "nudge migrate ") {
			line = l
		}
	}
	require.NotEmpty(t, line, "the README shows nudge migrate")
	require.NotRegexp(t, `PG queue\s*$|PG queue,`, line, "migrate does not create the PostgreSQL channel's tables")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestHealedRecords: a record the worker resolved because its projection passed the event by
// itself shows as healed, with the position passed, in list, show and their JSON.
func TestHealedRecords(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.store.Add(ctx, deadletter.Entry{
		Projection: "orders", MessageUUID: "m-4", Error: "canceling statement due to lock timeout",
		Metadata:     map[string]string{deadletter.MetadataTransient: "sqlstate 55P03"},
		FailingEvent: &eventstore.EventRef{ID: uuid.New(), Type: "OrderBad", Position: eventstore.Position{TransactionID: 700, GlobalPosition: 39}},
		At:           time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
	})
	require.NoError(t, err)
	n, err := f.store.ResolvePassed(ctx, "orders", eventstore.Position{TransactionID: 700, GlobalPosition: 40},
		time.Date(2025, 3, 1, 13, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	require.Equal(t, 1, n, "only record 4 is transient and passed")

	res := runCLI(t, f.env, "deadletter", "list")
	require.Equal(t, 0, res.code, res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 5, res.stdout)
	require.Regexp(t, `^1\s+orders\s+failed\s+`, lines[1])
	require.Regexp(t, `^4\s+orders\s+resolved \(healed\)\s+1\s+1\s+OrderBad\s+`, lines[4])

	res = runCLI(t, f.env, "deadletter", "show", "4")
	require.Equal(t, 0, res.code, res.stderr)
	for _, want := range []string{`status:\s+resolved \(healed\)\n`, `metadata nudge_transient_cause:\s+sqlstate 55P03\n`,
		`resolved by:\s+nudge \(healed\)\n`, `resolve note:\s+healed: projection passed position 700/40 at 2025-03-01T13:00:00Z\n`} {
		require.Regexp(t, want, res.stdout)
	}

	res = runCLI(t, f.env, "deadletter", "show", "4", "--json")
	require.Equal(t, 0, res.code, res.stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rec))
	require.Equal(t, "resolved", rec["status"])
	require.Equal(t, true, rec["healed"])
}
