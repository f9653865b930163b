package postgres_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// workerTimeout bounds a worker process's run, and a test of several (scaled by testwait): a
// catch-up of 50,000 events takes 15 s alone and minutes on a busy machine.
const workerTimeout = 10 * time.Minute

// The environment of a worker process: this test binary run again with
// -test.run=^TestWorkerProcess$.
const (
	// workerURLEnv is the database URL; TestWorkerProcess does nothing unless it is set.
	workerURLEnv = "NUDGE_WORKER_POSTGRES_URL"
	// workerBatchEnv is the projection's batch size; defaults to 200.
	workerBatchEnv = "NUDGE_WORKER_BATCH_SIZE"
	// workerProjectionEnv is the projection's name; defaults to "counter".
	workerProjectionEnv = "NUDGE_WORKER_PROJECTION"
	// workerTableEnv is the table the handler writes; defaults to "applied".
	workerTableEnv = "NUDGE_WORKER_TABLE"
	// workerBarrierEnv, set to 1, makes the worker wait after Init (when it prints "ready")
	// until its stdin is closed before catching up, so that several workers start at once.
	workerBarrierEnv = "NUDGE_WORKER_BARRIER"
)

// workerSpec is what one worker does: catch up projection name, whose handler counts event
// "A" in table, in batches of batchSize.
type workerSpec struct {
	name      string
	table     string
	batchSize int
}

// workerAppName is the application_name of the workers' connections.
const workerAppName = "nudge_crash_worker"

func (s workerSpec) env(dbURL string) []string {
	return []string{workerURLEnv + "=" + dbURL, workerBatchEnv + "=" + strconv.Itoa(s.batchSize),
		workerProjectionEnv + "=" + s.name, workerTableEnv + "=" + s.table}
}

// counterSpec is the worker of the tests' projection.
var counterSpec = workerSpec{name: "counter", table: "applied", batchSize: 200}

// TestWorkerProcess is the worker when the test binary is run again as a child process by the
// tests below; in a normal test run it returns at once. It prints "ready" when it has run Init
// and is about to catch up, catches the projection up with a runner of its own, printing
// "committed=<events>" after each batch it committed, then prints "invocations=<n>" (how often
// its handler ran) and exits 0.
func TestWorkerProcess(t *testing.T) {
	dbURL := os.Getenv(workerURLEnv)
	if dbURL == "" {
		return
	}
	spec := workerSpec{
		name:      cmp.Or(os.Getenv(workerProjectionEnv), counterSpec.name),
		table:     cmp.Or(os.Getenv(workerTableEnv), counterSpec.table),
		batchSize: counterSpec.batchSize,
	}
	if s := os.Getenv(workerBatchEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			workerFail(t, fmt.Errorf("%s=%q: %w", workerBatchEnv, s, err))
		}
		spec.batchSize = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(workerTimeout))
	defer cancel()
	backend := childBackend(t, ctx, dbURL)
	barrier := os.Getenv(workerBarrierEnv) == "1"
	start := func(context.Context) error {
		fmt.Println("ready")
		if !barrier {
			return nil
		}
		_, err := io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
		return err
	}
	var invocations atomic.Int64
	if err := catchUp(ctx, backend, spec, &invocations, start, printCommitted); err != nil {
		workerFail(t, fmt.Errorf("after %d invocations: %w", invocations.Load(), err))
	}
	fmt.Printf("invocations=%d\n", invocations.Load())
}

// childBackend opens a child process's backend on the database at dbURL; its pool closes when
// the test ends.
func childBackend(t *testing.T, ctx context.Context, dbURL string) *postgres.Backend {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		workerFail(t, err)
	}
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		workerFail(t, err)
	}
	backend, err := postgres.New(store)
	if err != nil {
		workerFail(t, err)
	}
	return backend
}

// printCommitted is the workers' RunnerConfig.OnBatch: it prints "committed=<events>" for every
// batch that committed, once the commit has returned.
func printCommitted(b projection.BatchReport) {
	if b.Err == nil && b.Events > 0 {
		fmt.Printf("committed=%d\n", b.Events)
	}
}

func workerFail(t *testing.T, err error) {
	fmt.Fprintf(os.Stderr, "worker %d: %v\n", os.Getpid(), err)
	t.FailNow()
}

// catchUp is one worker, in a child process or in a goroutine of the test: a runner of its own
// on backend catches the projection up until its status shows nothing left. The handler counts
// its invocations in invocations. start, if not nil, runs after Init and before the first
// catch-up; onBatch, if not nil, is the runner's OnBatch.
func catchUp(ctx context.Context, backend projection.Backend, spec workerSpec, invocations *atomic.Int64,
	start func(context.Context) error, onBatch func(projection.BatchReport)) error {
	insert := fmt.Sprintf(`INSERT INTO %[1]s (n, times) VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = %[1]s.times + 1`,
		pgx.Identifier{spec.table}.Sanitize())
	p, err := projection.New(spec.name, projection.Config{BatchSize: spec.batchSize},
		projection.On[projectiontest.Payload]("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
			invocations.Add(1)
			_, err := tx.Exec(ctx, insert, e.Data.N)
			return err
		}))
	if err != nil {
		return err
	}
	r, err := projection.NewRunner(backend, projection.RunnerConfig{OnBatch: onBatch}, p)
	if err != nil {
		return err
	}
	if err := r.Init(ctx); err != nil {
		return err
	}
	if start != nil {
		if err := start(ctx); err != nil {
			return err
		}
	}
	for {
		if _, err := r.CatchUp(ctx, spec.name); err != nil {
			return err
		}
		st, err := r.Status(ctx, spec.name)
		if err != nil {
			return err
		}
		if st.LagEvents == 0 && st.Position == st.Head {
			return nil
		}
	}
}

// child is a worker process.
type child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  bytes.Buffer
	ready   chan struct{} // closed when the worker printed "ready"
	holding chan struct{} // closed when the worker printed "holding" (held inside its work)
	done    chan struct{} // closed when the process has been waited for
	// committed receives the events of each batch the worker reported committed.
	committed chan int64

	// Set before done is closed.
	lines   []string // stdout
	waitErr error
}

// startChild starts a worker process for spec on the database at dbURL. It is killed when ctx
// ends.
func startChild(t *testing.T, ctx context.Context, dbURL string, spec workerSpec, barrier bool) *child {
	t.Helper()
	var env []string
	if barrier {
		env = append(env, workerBarrierEnv+"=1")
	}
	return startTestProcess(t, ctx, "TestWorkerProcess", append(env, spec.env(workerURL(t, dbURL))...))
}

// workerURL is dbURL with the workers' application_name, by which waitSessionsGone finds
// their sessions.
func workerURL(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", workerAppName)
	u.RawQuery = q.Encode()
	return u.String()
}

// startTestProcess runs the test test of this binary again as a child process with env added
// to the environment, and follows its output. It is killed when ctx ends.
func startTestProcess(t *testing.T, ctx context.Context, test string, env []string) *child {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1",
		"-test.timeout="+testwait.For(workerTimeout+time.Minute).String())
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0") // the race detector would idle 1 s at every exit
	cmd.Env = append(cmd.Env, env...)
	c := &child{cmd: cmd, ready: make(chan struct{}), holding: make(chan struct{}), done: make(chan struct{}),
		committed: make(chan int64, 1<<16)}
	cmd.Stderr = &c.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		defer close(c.done)
		var readyOnce, holdingOnce sync.Once
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			c.lines = append(c.lines, line)
			switch line {
			case "ready":
				readyOnce.Do(func() { close(c.ready) })
			case "holding":
				holdingOnce.Do(func() { close(c.holding) })
			}
			if n, ok := strings.CutPrefix(line, "committed="); ok {
				events, _ := strconv.ParseInt(n, 10, 64)
				select {
				case c.committed <- events:
				default: // nobody counts this worker's batches
				}
			}
		}
		c.waitErr = cmd.Wait() // after every read of stdout, as exec requires
	}()
	return c
}

// release lets a worker started with a barrier begin its catch-up.
func (c *child) release() error { return c.stdin.Close() }

// kill sends SIGKILL and waits for the process.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("kill worker %d: %v", c.cmd.Process.Pid, err)
	}
	<-c.done
}

// killed reports whether the process ended by SIGKILL. Call it after done is closed.
func (c *child) killed() bool {
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// output is what the worker printed, for failure messages.
func (c *child) output() string {
	return fmt.Sprintf("worker pid %d: %v\n--- stdout\n%s\n--- stderr\n%s", c.cmd.Process.Pid, c.waitErr,
		strings.Join(c.lines, "\n"), c.stderr.String())
}

// finish waits for the worker to end on its own and returns its invocation count. It fails the
// test, with the worker's output, if the worker failed or ctx ended first.
func (c *child) finish(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	select {
	case <-c.done:
	case <-ctx.Done():
		<-c.done // CommandContext kills it
		t.Fatalf("worker did not finish in time: %v\n%s", ctx.Err(), c.output())
	}
	require.NoError(t, c.waitErr, c.output())
	for _, line := range c.lines {
		if s, ok := strings.CutPrefix(line, "invocations="); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			require.NoError(t, err, c.output())
			return n
		}
	}
	t.Fatalf("worker printed no invocation count\n%s", c.output())
	return 0
}

// createCountTable creates the table a worker's handler writes to.
func createCountTable(t *testing.T, e env, table string) {
	t.Helper()
	_, err := e.db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (n int PRIMARY KEY, times int NOT NULL)`,
		pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
}

// counts returns the rows of table, the rows with times other than 1, and the sum of times.
func counts(t *testing.T, e env, table string) (rows, notOnce, sum int64) {
	t.Helper()
	err := e.db.Pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT count(*), count(*) FILTER (WHERE times <> 1), coalesce(sum(times), 0) FROM %s`, pgx.Identifier{table}.Sanitize()),
	).Scan(&rows, &notOnce, &sum)
	require.NoError(t, err)
	return rows, notOnce, sum
}

// waitSessionsGone waits until the server has ended the sessions of dead workers: a killed
// worker's transaction has then committed or rolled back, and its lock is free.
func waitSessionsGone(t *testing.T, e env) {
	t.Helper()
	var n int
	require.Eventually(t, func() bool {
		require.NoError(t, e.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
			workerAppName).Scan(&n))
		return n == 0
	}, testwait.For(time.Minute), 2*time.Millisecond, "%d sessions of dead workers still open", n)
}

// statusOf returns a runner in the test process for reading spec's projection status. Init
// registers the projection, as the workers do, so its status exists before any worker starts.
func statusOf(t *testing.T, e env, spec workerSpec) func() projection.Status {
	t.Helper()
	p, err := projection.New(spec.name, projection.Config{BatchSize: spec.batchSize},
		projection.On[projectiontest.Payload]("A", func(context.Context, pgx.Tx, projection.Event[projectiontest.Payload]) error {
			return errors.New("the status reader handles nothing")
		}))
	require.NoError(t, err)
	r, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t)}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))
	return func() projection.Status {
		t.Helper()
		st, err := r.Status(context.Background(), spec.name)
		require.NoError(t, err)
		return st
	}
}

// TestExactlyOnceUnderSIGKILL kills worker processes with SIGKILL in the middle of their
// catch-up, at least 10 times, then lets one finish: every event is applied exactly once,
// because the read model's writes and the position commit in one transaction.
//
// A kill waits for what the worker reports, never for a span of time, so it lands mid catch-up
// however busy the machine is: right after the worker reported its k-th committed batch (k
// from 1 to 4, in turn), while it works on the next one, or, every fifth run, as soon as it is
// ready, before its first commit. Every batch a killed worker reported stays committed.
func TestExactlyOnceUnderSIGKILL(t *testing.T) {
	t.Parallel()
	const (
		events    = 10_000
		chunk     = 5_000 // appended when the projection catches up before enough kills
		wantKills = 10
	)
	e := newEnv(t)
	ctx := testwait.Context(t, workerTimeout)
	spec := counterSpec
	spec.batchSize = 100
	createCountTable(t, e, spec.table)
	appended := events
	projectiontest.AppendN(t, e.store, 0, events, "A")

	status := statusOf(t, e, spec)
	var (
		runs, kills, killsAfterProgress, finishedRuns, chunks int
		perKill                                               []int64 // events committed by each killed run
	)
	for kills < wantKills {
		require.NoError(t, ctx.Err(), "only %d kills mid catch-up so far", kills)
		before := status()
		c := startChild(t, ctx, e.db.URL, spec, false)
		reported := c.killAfter(t, runs%5) // 0: as soon as the worker is ready
		runs++
		if !c.killed() {
			require.NoError(t, c.waitErr, c.output())
			finishedRuns++
		}
		waitSessionsGone(t, e)
		after := status()
		rows, notOnce, sum := counts(t, e, spec.table)
		require.Zero(t, notOnce, "an event was applied more than once (after %d kills)", kills)
		require.Equal(t, rows, sum)
		require.Equal(t, after.EventsProcessed, rows, "the applied rows match the committed position's count")
		require.Equal(t, projection.StateRunning, after.State, after.LastError)
		progress := after.EventsProcessed - before.EventsProcessed
		require.GreaterOrEqual(t, progress, reported, "every batch the worker reported before its kill stays committed")
		if c.killed() && after.LagEvents > 0 {
			kills++
			if progress > 0 {
				killsAfterProgress++
				perKill = append(perKill, progress)
			}
			continue
		}
		if after.LagEvents == 0 && kills < wantKills {
			// Caught up before enough kills: give the workers more to do.
			projectiontest.AppendN(t, e.store, appended, chunk, "A")
			appended += chunk
			chunks++
		}
	}
	require.Positive(t, killsAfterProgress, "no kill landed after a worker had committed a batch")

	last := startChild(t, ctx, e.db.URL, spec, false)
	last.finish(t, ctx)
	rows, notOnce, _ := counts(t, e, spec.table)
	require.Equal(t, int64(appended), rows, "every event applied")
	require.Zero(t, notOnce, "no event applied twice")
	st := status()
	require.Equal(t, projection.StateRunning, st.State)
	require.Zero(t, st.LagEvents)
	require.Equal(t, st.Head, st.Position)
	require.Equal(t, int64(appended), st.EventsProcessed)
	// Evidence that kills cut batches off in flight: the server rolled their transactions back.
	var rollbacks int64
	require.NoError(t, e.db.Pool.QueryRow(context.Background(),
		`SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&rollbacks))
	t.Logf("%d events (%d chunks of %d added), %d SIGKILLs mid catch-up (%d after the worker had committed batches; events committed per killed run %v), %d runs that finished before their kill; %d transactions rolled back in the database",
		appended, chunks, chunk, kills, killsAfterProgress, perKill, finishedRuns, rollbacks)
}

// killAfter kills the worker with SIGKILL once it has reported batches committed batches (0:
// once it is ready), unless it ends first, and waits for it. It returns the events of the
// batches the worker reported committed before the kill.
func (c *child) killAfter(t *testing.T, batches int) (reported int64) {
	t.Helper()
	select {
	case <-c.ready:
	case <-c.done: // failed before it was ready
		return 0
	}
	for range batches {
		select {
		case n := <-c.committed:
			reported += n
		case <-c.done: // finished (or failed) first
			return reported + c.drainCommitted()
		}
	}
	c.kill(t)
	return reported + c.drainCommitted()
}

// drainCommitted returns the events of the batches reported and not yet received. Call it
// after done is closed.
func (c *child) drainCommitted() (n int64) {
	for {
		select {
		case events := <-c.committed:
			n += events
		default:
			return n
		}
	}
}

// TestConcurrentWorkersSplitTheWork starts two worker processes and four runners in the test
// process at once on one projection: the backend's lock serialises their batches, so every
// event is applied once and handled once in all.
func TestConcurrentWorkersSplitTheWork(t *testing.T) {
	t.Parallel()
	const (
		events     = 50_000
		children   = 2
		goroutines = 4
	)
	e := newEnv(t)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, if the test fails early
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(workerTimeout))
	defer cancel()
	spec := counterSpec
	createCountTable(t, e, spec.table)
	projectiontest.AppendN(t, e.store, 0, events, "A")

	procs := make([]*child, children)
	for i := range procs {
		procs[i] = startChild(t, ctx, e.db.URL, spec, true)
	}
	var (
		start       = make(chan struct{})
		ready       sync.WaitGroup
		invocations [goroutines]atomic.Int64
		errs        [goroutines]error
	)
	for i := range goroutines {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(ready.Done) // also when catchUp fails before start
			errs[i] = catchUp(ctx, e.backend, spec, &invocations[i], func(ctx context.Context) error {
				once.Do(ready.Done)
				select {
				case <-start:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, nil)
		}()
	}
	ready.Wait()
	for _, c := range procs {
		select {
		case <-c.ready:
		case <-c.done:
			t.Fatalf("worker ended before it was ready\n%s", c.output())
		case <-ctx.Done():
			t.Fatalf("worker not ready in time\n%s", c.output())
		}
	}
	close(start)
	for _, c := range procs {
		require.NoError(t, c.release())
	}

	split := make([]int64, 0, children+goroutines)
	for _, c := range procs {
		split = append(split, c.finish(t, ctx))
	}
	wg.Wait()
	for i := range goroutines {
		require.NoError(t, errs[i], "goroutine %d", i)
		split = append(split, invocations[i].Load())
	}
	var total int64
	for _, n := range split {
		total += n
	}
	t.Logf("%d events; invocations by process %v and by goroutine %v", events, split[:children], split[children:])

	rows, notOnce, _ := counts(t, e, spec.table)
	require.Equal(t, int64(events), rows, "every event applied")
	require.Zero(t, notOnce, "no event applied twice")
	require.Equal(t, int64(events), total, "the workers did not duplicate work: %v", split)
}
