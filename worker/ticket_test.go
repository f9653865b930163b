package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

type ticketRegistered struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

type ticketClosed struct {
	ID string `json:"id"`
}

// tickets is the seed scenario's pair of projections on one database.
func (s *setup) tickets(t testing.TB) (list, stats *projection.Projection) {
	t.Helper()
	list, err := projection.New("ticket_list", projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_list (
				id text PRIMARY KEY, ticket_type varchar(25) NOT NULL, status text NOT NULL, applied int NOT NULL)`)
			return err
		},
	},
		projection.On("TicketWasRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ticket_list VALUES ($1, $2, 'open', 1)
				ON CONFLICT (id) DO UPDATE SET applied = ticket_list.applied + 1`, e.Data.ID, e.Data.Type)
			return err
		}),
		projection.On("TicketWasClosed", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketClosed]) error {
			_, err := tx.Exec(ctx, `UPDATE ticket_list SET status = 'closed', applied = applied + 1 WHERE id = $1`, e.Data.ID)
			return err
		}))
	require.NoError(t, err)
	stats, err = projection.New("ticket_stats", projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_stats (kind text PRIMARY KEY, n int NOT NULL)`)
			return err
		},
	},
		projection.On("TicketWasRegistered", func(ctx context.Context, tx pgx.Tx, _ projection.Event[ticketRegistered]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ticket_stats VALUES ('registered', 1) ON CONFLICT (kind) DO UPDATE SET n = ticket_stats.n + 1`)
			return err
		}),
		projection.On("TicketWasClosed", func(ctx context.Context, tx pgx.Tx, _ projection.Event[ticketClosed]) error {
			_, err := tx.Exec(ctx, `INSERT INTO ticket_stats VALUES ('closed', 1) ON CONFLICT (kind) DO UPDATE SET n = ticket_stats.n + 1`)
			return err
		}))
	require.NoError(t, err)
	return list, stats
}

func (s *setup) register(t testing.TB, id, ticketType string) {
	t.Helper()
	data, err := eventstore.NewEventData("TicketWasRegistered", ticketRegistered{ID: id, Type: ticketType})
	require.NoError(t, err)
	s.append(t, "ticket-"+id, data)
}

func (s *setup) closeTicket(t testing.TB, id string) {
	t.Helper()
	data, err := eventstore.NewEventData("TicketWasClosed", ticketClosed{ID: id})
	require.NoError(t, err)
	s.append(t, "ticket-"+id, data)
}

func (s *setup) scalar(t testing.TB, query string) int {
	t.Helper()
	var n int
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// TestTicketScenario is the scenario nudge exists for, on RabbitMQ and on the PostgreSQL queue:
// ticket_list's column is too short for one ticket type; that trigger is retried and
// dead-lettered naming the event; ticket_stats keeps projecting every event; more tickets come
// and go; the column is widened; a replay (or, in the second variant, a worker restart) makes
// ticket_list catch up with every event, each once. No reset, no skipped event.
func TestTicketScenario(t *testing.T) {
	t.Parallel()
	for _, channelName := range []string{"amqp", "postgres"} {
		// own-router: the handlers run on a router of the service's own (AddHandlers and
		// RunBackground); the deploy of the fix heals the projection with no command.
		for _, heal := range []string{"replay", "restart", "own-router"} {
			t.Run(channelName+"/"+heal, func(t *testing.T) {
				t.Parallel()
				ticketScenario(t, channelName, heal)
			})
		}
	}
}

func ticketScenario(t *testing.T, channelName, heal string) {
	ctx := context.Background()
	s := newSetup(t)
	s.ownRouter = heal == "own-router"
	ch := s.newChannel(t, channels[channelName])
	dead, err := dlpg.New(s.db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(ctx))
	cfg := worker.Config{
		SafetyNetInterval: -1, // only triggers, replays and restarts heal here
		Retry:             retry.Policy{MaxAttempts: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		DeadLetters:       dead,
	}
	list, stats := s.tickets(t)
	_, stop := s.startStoppable(t, ch, cfg, list, stats)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })

	for i := 1; i <= 5; i++ {
		s.register(t, fmt.Sprint(i), "bug")
	}
	require.Eventually(t, func() bool { return s.scalar(t, `SELECT count(*) FROM ticket_list`) == 5 }, eventually, 10*time.Millisecond)

	longType := strings.Repeat("x", 30)
	s.register(t, "6", longType)
	var rec deadletter.Record
	require.Eventually(t, func() bool {
		recs, err := dead.List(ctx, deadletter.Filter{Projection: "ticket_list"})
		require.NoError(t, err)
		if len(recs) == 0 {
			return false
		}
		rec = recs[0]
		return true
	}, eventually, 10*time.Millisecond, "ticket_list's poison trigger is dead-lettered")
	require.Contains(t, rec.Error, "value too long")
	require.NotNil(t, rec.FailingEvent)
	require.Equal(t, "TicketWasRegistered", rec.FailingEvent.Type)
	poison, err := s.store.ReadStream(ctx, "ticket-6", 0, 0)
	require.NoError(t, err)
	require.Equal(t, poison[0].Ref(), *rec.FailingEvent, "the dead letter names the event: id, type, stream and position")
	require.Equal(t, deadletter.StatusFailed, rec.Status)

	// ticket_stats keeps going while ticket_list is stuck; more tickets come and go.
	for i := 7; i <= 10; i++ {
		s.register(t, fmt.Sprint(i), "question")
	}
	for i := 1; i <= 3; i++ {
		s.closeTicket(t, fmt.Sprint(i))
	}
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT coalesce(sum(n) FILTER (WHERE kind = 'registered'), 0) FROM ticket_stats`) == 10 &&
			s.scalar(t, `SELECT coalesce(sum(n) FILTER (WHERE kind = 'closed'), 0) FROM ticket_stats`) == 3
	}, eventually, 10*time.Millisecond, "ticket_stats projects every event meanwhile")
	require.Equal(t, 5, s.scalar(t, `SELECT count(*) FROM ticket_list`), "ticket_list waits before the poison event")

	// The fix, then the healing.
	_, err = s.db.Pool.Exec(ctx, `ALTER TABLE ticket_list ALTER COLUMN ticket_type TYPE varchar(100)`)
	require.NoError(t, err)
	switch heal {
	case "replay":
		// What an operator runs: nudge deadletter replay --projection ticket_list.
		args := []string{"--db", s.db.URL, "--channel", channelName, "deadletter", "replay", "--projection", "ticket_list", "--by", "ops"}
		if s.amqp != nil {
			args = append(args, "--amqp", s.amqp.URL, "--amqp-prefix", s.amqp.Prefix)
		}
		out, err := exec.Command(nudgeCLI(t), args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
	case "restart", "own-router":
		stop()
		list, stats := s.tickets(t)
		s.startStoppable(t, ch, cfg, list, stats) // replays dead letters at start
	}
	require.Eventually(t, func() bool {
		return s.scalar(t, `SELECT count(*) FROM ticket_list`) == 10 &&
			s.scalar(t, `SELECT count(*) FROM ticket_list WHERE status = 'closed'`) == 3
	}, eventually, 10*time.Millisecond, "ticket_list catches up with every event")
	require.Zero(t, s.scalar(t, `SELECT count(*) FROM ticket_list WHERE applied <> CASE WHEN status = 'closed' THEN 2 ELSE 1 END`),
		"each event applied exactly once")
	require.Equal(t, longType, func() string {
		var typ string
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT ticket_type FROM ticket_list WHERE id = '6'`).Scan(&typ))
		return typ
	}(), "no event skipped")

	var st projection.Status
	require.Eventually(t, func() bool {
		runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, list)
		require.NoError(t, err)
		st, err = runner.Status(ctx, "ticket_list")
		require.NoError(t, err)
		return st.State == projection.StateRunning && st.CaughtUp()
	}, eventually, 10*time.Millisecond)
	require.Nil(t, st.FailingEvent)
	// (At a restart, queued triggers may heal the projection before the replay at start has
	// marked the record.)
	require.Eventually(t, func() bool {
		rec, err = dead.Get(ctx, rec.ID)
		require.NoError(t, err)
		return rec.Status == deadletter.StatusReplayed
	}, eventually, 10*time.Millisecond, "the dead letter is marked replayed")
	if heal != "replay" {
		require.Equal(t, "worker start", rec.ReplayedBy)
	}
}

// failingStore fails every Add while down.
type failingStore struct {
	deadletter.Store
	down  atomic.Bool
	tries atomic.Int64
}

func (f *failingStore) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	f.tries.Add(1)
	if f.down.Load() {
		return deadletter.Record{}, errors.New("dead-letter store unreachable")
	}
	return f.Store.Add(ctx, e)
}

// TestDeadLetterWriteFails: while the dead-letter store cannot be written, the trigger is nacked
// and comes back, never lost; once the store is back it is dead-lettered.
func TestDeadLetterWriteFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t)
	ch := s.newChannel(t, channels["amqp"])
	pg, err := dlpg.New(s.db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, pg.Migrate(ctx))
	store := &failingStore{Store: pg}
	store.down.Store(true)
	s.start(t, ch, worker.Config{
		SafetyNetInterval: -1,
		Retry:             retry.Policy{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
		DeadLetters:       store,
	}, s.model(t, "alpha", func(int) error { return errors.New("broken") }))

	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return store.tries.Load() >= 3 }, eventually, 5*time.Millisecond,
		"the trigger came back after each failed dead-letter write")
	recs, err := pg.List(ctx, deadletter.Filter{})
	require.NoError(t, err)
	require.Empty(t, recs)

	store.down.Store(false)
	require.Eventually(t, func() bool {
		recs, err = pg.List(ctx, deadletter.Filter{Projection: "alpha"})
		require.NoError(t, err)
		return len(recs) == 1
	}, eventually, 5*time.Millisecond, "dead-lettered once the store is back")
	require.Equal(t, 1, recs[0].Count)
	require.Contains(t, recs[0].Error, "broken")
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// nudgeCLI builds cmd/nudge once per test binary and returns its path.
func nudgeCLI(t testing.TB) string {
	t.Helper()
	cliOnce.Do(func() {
		// One fixed place, overwritten by every run, so nothing piles up in the temp directory.
		dir := filepath.Join(os.TempDir(), "nudge-worker-test-cli")
		if cliErr = os.MkdirAll(dir, 0o755); cliErr != nil {
			return
		}
		cliPath = filepath.Join(dir, "nudge")
		building := fmt.Sprintf("%s.%d", cliPath, os.Getpid())
		out, err := exec.Command("go", "build", "-o", building, "../cmd/nudge").CombinedOutput()
		if err != nil {
			cliErr = fmt.Errorf("build cmd/nudge: %w: %s", err, out)
			return
		}
		cliErr = os.Rename(building, cliPath) // atomic: a concurrent run never sees half a binary
	})
	require.NoError(t, cliErr)
	return cliPath
}
