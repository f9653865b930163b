package nudge_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/stallproxy"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// Environment of the service process TestClosePoolsBounded starts: the test binary itself,
// which runs closingService instead of the tests.
const (
	serviceEnv       = "NUDGE_TEST_RUN_SERVICE"
	serviceDBEnv     = "NUDGE_TEST_SERVICE_DB"
	serviceDeadEnv   = "NUDGE_TEST_SERVICE_DEAD_LETTERS_DB"
	serviceCloseTime = time.Second
)

func TestMain(m *testing.M) {
	if os.Getenv(serviceEnv) == "1" {
		os.Exit(closingService())
	}
	os.Exit(m.Run())
}

// closingService is a service as the README wires one, with its dead letters in a database of
// their own: it runs the client until SIGTERM, then closes its pools with ClosePools. It
// prints "running" once the handlers run and "pools closed: <error>" at the end.
func closingService() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, os.Getenv(serviceDBEnv))
	if err != nil {
		logger.Error("pool", slog.Any("error", err))
		return 1
	}
	deadPool, err := pgxpool.New(ctx, os.Getenv(serviceDeadEnv))
	if err != nil {
		logger.Error("dead-letter pool", slog.Any("error", err))
		return 1
	}
	client, err := newClosingClient(pool, deadPool, logger)
	if err == nil {
		err = client.Migrate(ctx)
	}
	if err != nil {
		logger.Error("client", slog.Any("error", err))
		return 1
	}
	go func() {
		<-client.Worker().Running()
		fmt.Println("running")
	}()
	if err := client.Run(ctx); err != nil {
		logger.Error("run", slog.Any("error", err))
		return 1
	}
	err = client.ClosePools(pool, deadPool)
	fmt.Printf("pools closed: %v\n", err)
	return 0
}

// announcedAdds prints "dead-letter write started" at each Add of a dead-letter store.
type announcedAdds struct{ deadletter.Store }

func (a announcedAdds) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	fmt.Println("dead-letter write started")
	return a.Store.Add(ctx, e)
}

// newClosingClient is closingService's client: one projection on GoChannel that fails on every
// event, with no retries, the dead letters in deadPool's database.
func newClosingClient(pool, deadPool *pgxpool.Pool, logger *slog.Logger) (*nudge.Client, error) {
	dead, err := dlpg.New(deadPool, dlpg.Config{})
	if err != nil {
		return nil, err
	}
	ch, err := gochannel.New(gochannel.Config{})
	if err != nil {
		return nil, err
	}
	p, err := projection.New("tickets", projection.Config{}, projection.On("TicketRegistered",
		func(context.Context, pgx.Tx, projection.Event[ticketRegistered]) error {
			return errors.New("cannot project a ticket")
		}))
	if err != nil {
		return nil, err
	}
	return nudge.New(pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{p}, DeadLetters: announcedAdds{dead},
		Retry: retry.Policy{MaxAttempts: 1}, DeadLetterTimeout: time.Hour, CloseTimeout: serviceCloseTime, Logger: logger})
}

// lockedBuffer is a bytes.Buffer safe for a process's output and a test's reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestClosePoolsBounded: a service whose dead-letter database is partitioned away (a proxy
// that keeps its connections open and forwards nothing) gets SIGTERM while a dead-letter write
// is blocked there. Run returns (the shutdown cancels the write; the trigger is nacked), and
// closing the pools — pgx waits up to 15 s for the interrupted connection to that database —
// gives up after CloseTimeout with ErrCloseTimeout and a warning, so the process exits.
func TestClosePoolsBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	dead, err := dlpg.New(db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(context.Background()))
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	proxy, err := stallproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	deadURL, err := url.Parse(db.URL)
	require.NoError(t, err)
	deadURL.Host = proxy.Addr()

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serviceEnv+"=1", serviceDBEnv+"="+db.URL, serviceDeadEnv+"="+deadURL.String())
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "running") }, eventually, 10*time.Millisecond,
		"stderr: %s", &stderr)

	proxy.Stall()
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "t-1", Type: "bug"})
	require.NoError(t, err)
	_, err = store.Append(context.Background(), "ticket-t-1", eventstore.NoStream, data)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "dead-letter write started") }, eventually, 10*time.Millisecond,
		"the failing event's dead letter is being written, blocked on the partition; stderr: %s", &stderr)
	signalled := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err, "stderr: %s", &stderr)
	case <-time.After(eventually):
		t.Fatalf("the service did not exit within %s of SIGTERM; stdout: %s; stderr: %s", eventually, &stdout, &stderr)
	}
	t.Logf("exited %s after SIGTERM (CloseTimeout %s)", time.Since(signalled).Round(time.Millisecond), serviceCloseTime)
	require.Contains(t, stdout.String(), "pools closed: "+nudge.ErrCloseTimeout.Error(), "the bound was applied; stderr: %s", &stderr)
	require.Contains(t, stderr.String(), "closing the pools did not finish within CloseTimeout")
}
