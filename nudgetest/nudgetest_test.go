package nudgetest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/projection"
)

type registered struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

// ticketList keeps tickets(id, title) and fails on a title longer than 10 characters.
func ticketList(t testing.TB, cfg projection.Config) *projection.Projection {
	t.Helper()
	cfg.InitFunc = func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS tickets (id text PRIMARY KEY, title varchar(10) NOT NULL, n int NOT NULL)`)
		return err
	}
	p, err := projection.New("ticket_list", cfg,
		projection.On("TicketWasRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[registered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO tickets (id, title, n) VALUES ($1, $2, $3)`, e.Data.ID, e.Data.Title, e.StreamVersion)
			return err
		}))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newKit(t *testing.T, cfg projection.Config) *nudgetest.Kit {
	t.Helper()
	db := nudgetest.Database(t, nudgetest.Options{})
	return nudgetest.New(t, db, nudge.Config{Projections: []*projection.Projection{ticketList(t, cfg)}})
}

func register(t testing.TB, kit *nudgetest.Kit, id, title string) {
	t.Helper()
	kit.Append(t, "ticket-"+id, nudgetest.Event(t, "TicketWasRegistered", registered{ID: id, Title: title}))
}

// recorder is a testing.TB whose Fatal and Fatalf record the message and end the goroutine,
// as testing's do.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

// fatal runs check with a recorder and returns the message it failed with; it fails t if
// check passed.
func fatal(t *testing.T, check func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan bool)
	go func() {
		defer close(done)
		check(r)
		done <- true
	}()
	if passed := <-done; passed {
		t.Fatal("the assertion passed; want it to fail")
	}
	t.Logf("failure message:\n%s", r.msg)
	return r.msg
}

func requireContains(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("message lacks %q:\n%s", p, msg)
		}
	}
}

func TestDatabaseIsACopyOfTheTemplate(t *testing.T) {
	t.Parallel()
	var migrations atomic.Int32
	opts := nudgetest.Options{MigrateFunc: func(ctx context.Context, pool *pgxpool.Pool) error {
		migrations.Add(1)
		_, err := pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY)`)
		return err
	}}
	a, b := nudgetest.Database(t, opts), nudgetest.Database(t, opts)
	if a.Name == b.Name {
		t.Fatalf("two tests share database %s", a.Name)
	}
	ctx := context.Background()
	if _, err := a.Pool.Exec(ctx, `INSERT INTO accounts VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	for _, db := range []*nudgetest.DB{a, b} {
		var events, accounts int
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM nudge_events), (SELECT count(*) FROM accounts)`).Scan(&events, &accounts); err != nil {
			t.Fatalf("%s: nudge's and the service's tables: %v", db.Name, err)
		}
		if want := map[string]int{a.Name: 1, b.Name: 0}[db.Name]; accounts != want {
			t.Errorf("%s has %d accounts, want %d: the databases are not separate", db.Name, accounts, want)
		}
	}
	if n := migrations.Load(); n != 1 {
		t.Errorf("MigrateFunc ran %d times for two databases, want once (for the template)", n)
	}
}

func TestRunToHeadAndRequireRows(t *testing.T) {
	t.Parallel()
	kit := newKit(t, projection.Config{BatchSize: 2})
	for _, id := range []string{"1", "2", "3"} {
		register(t, kit, id, "title "+id)
	}
	kit.RunToHead(t)
	settle(t, kit, "ticket_list")
	kit.RequireCondition(t, "ticket_list", projection.ConditionCaughtUp)
	kit.RequireRows(t, []nudgetest.Row{
		{"id": "1", "title": "title 1", "n": 1},
		{"id": "2", "title": "title 2", "n": 1},
		{"id": "3", "title": "title 3", "n": 1},
	}, `SELECT id, title, n FROM tickets ORDER BY id`)
	kit.RequireRows(t, nil, `SELECT id FROM tickets WHERE id = $1`, "4")
	kit.RequireRows(t, []nudgetest.Row{{"state": projection.StateFailing, "amount": 2.5, "big": 7, "none": nil}},
		`SELECT 'failing' AS state, 2.5::numeric AS amount, 7::bigint AS big, NULL::text AS none`)

	msg := fatal(t, func(tb testing.TB) {
		kit.RequireRows(tb, []nudgetest.Row{{"id": "1", "title": "title 1"}, {"id": "2", "title": "title two"}},
			`SELECT id, title FROM tickets ORDER BY id`)
	})
	requireContains(t, msg, "returned 3 rows, want 2",
		`    id="1" title="title 1"`, `  - id="2" title="title two"`, `  + id="2" title="title 2"`, `  + id="3" title="title 3"`)
	for deadline := time.Now().Add(10 * time.Second); ; {
		settle(t, kit, "ticket_list")
		msg = fatal(t, func(tb testing.TB) {
			kit.RequireCondition(tb, "ticket_list", projection.ConditionFailing)
		})
		if !strings.Contains(msg, " is held, ") || time.Now().After(deadline) { // held again a moment: read again
			break
		}
	}
	requireContains(t, msg, "projection ticket_list is caught_up, want failing", "3 events processed")
}

// settle waits, up to 10 s, until the projection's status is not held by the store's horizon:
// another database's transaction in its commit window may hold it a moment (go test runs
// packages side by side), and its condition reads held meanwhile.
func settle(t *testing.T, kit *nudgetest.Kit, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); kit.Status(t, name).HeldByHorizon && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFailure(t *testing.T) {
	t.Parallel()
	kit := newKit(t, projection.Config{})
	register(t, kit, "1", "short")
	register(t, kit, "2", "far too long a title")

	msg := fatal(t, func(tb testing.TB) { kit.RunToHead(tb) })
	requireContains(t, msg, "projection ticket_list", "value too long for type character varying(10)")
	var herr *projection.HandlerError
	if err := kit.CatchUp(t); !errors.As(err, &herr) {
		t.Fatalf("CatchUp returned %v, want a *projection.HandlerError", err)
	}
	st := kit.RequireFailure(t, "ticket_list", "value too long")
	if st.FailingEvent.StreamID != "ticket-2" {
		t.Errorf("failing event in stream %s, want ticket-2", st.FailingEvent.StreamID)
	}
	kit.RequireCondition(t, "ticket_list", projection.ConditionFailing)
	kit.RequireRows(t, []nudgetest.Row{{"id": "1"}}, `SELECT id FROM tickets`)

	msg = fatal(t, func(tb testing.TB) { kit.RequireFailure(tb, "ticket_list", "duplicate key") })
	requireContains(t, msg, `fails with an error without "duplicate key"`,
		"failing event TicketWasRegistered", "of stream ticket-2", "last error:", "value too long")
	msg = fatal(t, func(tb testing.TB) { kit.RequireCondition(tb, "ticket_list", projection.ConditionCaughtUp) })
	requireContains(t, msg, "is failing, want caught_up", "of stream ticket-2")
}

func TestRequireFailureOnAHealthyProjection(t *testing.T) {
	t.Parallel()
	kit := newKit(t, projection.Config{})
	register(t, kit, "1", "short")
	kit.RunToHead(t)
	msg := fatal(t, func(tb testing.TB) { kit.RequireFailure(tb, "ticket_list", "value too long") })
	requireContains(t, msg, "projection ticket_list is not failing", "state running")
}

func TestRequireParked(t *testing.T) {
	t.Parallel()
	kit := newKit(t, projection.Config{OnFailure: projection.OnFailurePark, ParkAfterAttempts: 1})
	register(t, kit, "1", "short")
	register(t, kit, "2", "far too long a title")
	register(t, kit, "3", "short too")
	kit.RunToHead(t)
	kit.RequireParked(t, "ticket_list", "ticket-2")
	kit.RequireRows(t, []nudgetest.Row{{"id": "1"}, {"id": "3"}}, `SELECT id FROM tickets ORDER BY id`)

	msg := fatal(t, func(tb testing.TB) { kit.RequireParked(tb, "ticket_list") })
	requireContains(t, msg, `projection ticket_list parked ["ticket-2"], want []`,
		"ticket-2: parked at TicketWasRegistered", "value too long")
}

func TestRequireDeadLetters(t *testing.T) {
	t.Parallel()
	kit := newKit(t, projection.Config{})
	kit.RequireDeadLetters(t, "ticket_list", 0)
	// A worker that ran out of retries on a trigger writes this.
	if _, err := kit.Client.DeadLetters().Add(context.Background(), deadletter.Entry{
		Projection: "ticket_list", MessageUUID: "m-1", Error: "value too long", Attempts: 3, At: time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	recs := kit.RequireDeadLetters(t, "ticket_list", 1)
	if recs[0].Attempts != 3 {
		t.Errorf("dead letter with %d attempts, want 3", recs[0].Attempts)
	}
	msg := fatal(t, func(tb testing.TB) { kit.RequireDeadLetters(tb, "ticket_list", 0) })
	requireContains(t, msg, "projection ticket_list has 1 failed dead letters, want 0", "3 attempts: value too long")
}

// TestSchema: with Options.Schema, nudge's tables, the service's and the read model are in
// that schema, and the kit's queries find them by their plain names.
func TestSchema(t *testing.T) {
	t.Parallel()
	db := nudgetest.Database(t, nudgetest.Options{Schema: "helpdesk", MigrateFunc: func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, `CREATE TABLE customers (id text PRIMARY KEY)`)
		return err
	}})
	kit := nudgetest.New(t, db, nudge.Config{Projections: []*projection.Projection{ticketList(t, projection.Config{})}})
	register(t, kit, "1", "short")
	kit.RunToHead(t)
	kit.RequireRows(t, []nudgetest.Row{{"id": "1"}}, `SELECT id FROM tickets`)
	kit.RequireRows(t, []nudgetest.Row{{"table_name": "customers"}, {"table_name": "nudge_events"}, {"table_name": "tickets"}},
		`SELECT table_name FROM information_schema.tables WHERE table_schema = 'helpdesk' AND table_name IN ('customers', 'nudge_events', 'tickets') ORDER BY 1`)
	kit.RequireRows(t, []nudgetest.Row{{"n": 0}}, `SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'public'`)
}

// TestMigrateFuncFails: a failing MigrateFunc fails the test, naming it and its error.
func TestMigrateFuncFails(t *testing.T) {
	t.Parallel()
	msg := fatal(t, func(tb testing.TB) {
		nudgetest.Database(tb, nudgetest.Options{MigrateFunc: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `CREATE TABLE nudge_events (id int)`)
			return err
		}})
	})
	requireContains(t, msg, "build the template database: Options.MigrateFunc:", `"nudge_events" already exists`)
}

// TestNewInMemory: the in-memory kit catches up and reports failures without a server, and
// says that it has no rows to query.
func TestNewInMemory(t *testing.T) {
	t.Parallel()
	var seen atomic.Int32
	p, err := projection.New("counter", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[registered]) error {
			if e.Data.Title == "poison" {
				return errors.New("cannot count poison")
			}
			seen.Add(1)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	kit := nudgetest.NewInMemory(t, nudge.Config{Projections: []*projection.Projection{p}})
	register(t, kit, "1", "fine")
	kit.RunToHead(t)
	if n := seen.Load(); n != 1 {
		t.Fatalf("counted %d events, want 1", n)
	}
	register(t, kit, "2", "poison")
	if err := kit.CatchUp(t); err == nil {
		t.Fatal("CatchUp passed a poison event")
	}
	kit.RequireFailure(t, "counter", "cannot count poison")
	msg := fatal(t, func(tb testing.TB) { kit.Rows(tb, `SELECT 1`) })
	requireContains(t, msg, "this kit is in memory (NewInMemory)")
}
