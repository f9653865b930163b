package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/retry"
)

// TestMain checks, after a full run, that no goroutine leaked and that every curl command of
// README.md was sent by some test (see exercised).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(
			// pgx pools close their health check asynchronously.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	if code == 0 && fullRun() && exercisedCount() > 0 {
		if err := checkReadmeExercised("README.md"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// fullRun reports whether every test ran (no -run or -skip filter).
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// waitFor bounds every wait on a condition: an upper bound for a failure on a busy machine,
// never the expected time.
var waitFor = testwait.For(2 * time.Minute)

const (
	tick = 20 * time.Millisecond
	// testPoolConns keeps each instance's pools small: many tests share one server.
	testPoolConns = 6
)

// The README's sample requests, used by the tests as they are written there.
const (
	bodyPrinter = `{"title":"Printer on fire","customer":"acme"}`
	bodyCoffee  = `{"title":"Coffee machine leaks","customer":"acme"}`
	bodyVPN     = `{"title":"VPN drops every hour","customer":"globex"}`
	bodyClose   = `{"reason":"replaced the toner"}`
)

// longTitle is the README's $LONG: 150 characters, which the API accepts (up to 200) and
// ticket_list's default column (100) does not.
var longTitle = strings.Repeat("x", 150)

// bodyLong registers a ticket with longTitle, as README.md does.
var bodyLong = `{"title":"` + longTitle + `","customer":"globex"}`

// testEnv is one test's database and broker corner, shared by the instances it starts.
type testEnv struct {
	t    *testing.T
	kind ChannelKind
	db   *nudgetest.DB
	amqp *amqptest.Env // ChannelAMQP only
}

// newTestEnv gives t a database with nudge's tables (a copy of nudgetest's template) and, for
// ChannelAMQP, a corner of RabbitMQ.
func newTestEnv(t *testing.T, kind ChannelKind) *testEnv {
	t.Helper()
	return newTestEnvOn(t, kind, nudgetest.Database(t, nudgetest.Options{}))
}

// newBareTestEnv is newTestEnv on an empty database, for a test of the service's own
// migrations.
func newBareTestEnv(t *testing.T, kind ChannelKind) *testEnv {
	t.Helper()
	db := pgtest.New(t)
	return newTestEnvOn(t, kind, &nudgetest.DB{Name: db.Name, URL: db.URL, Pool: db.Pool})
}

func newTestEnvOn(t *testing.T, kind ChannelKind, db *nudgetest.DB) *testEnv {
	t.Helper()
	e := &testEnv{t: t, kind: kind, db: db}
	if kind == ChannelAMQP {
		e.amqp = amqptest.New(t)
	}
	return e
}

// eachChannel runs test as a parallel subtest on both channels, each with its own testEnv.
func eachChannel(t *testing.T, test func(t *testing.T, e *testEnv)) {
	t.Helper()
	for _, kind := range ChannelKinds() {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			test(t, newTestEnv(t, kind))
		})
	}
}

// config is the service configuration of an instance in mode: fast retries, no safety net
// (only triggers, replays and restarts make projections catch up), a 10 ms poll.
func (e *testEnv) config(mode Mode) Config {
	cfg := Config{
		DatabaseURL:  withParam(e.db.URL, "pool_max_conns", fmt.Sprint(testPoolConns)),
		Channel:      e.kind,
		Mode:         mode,
		SafetyNet:    -1,
		PollInterval: 10 * time.Millisecond,
		Retry:        retry.Policy{MaxAttempts: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		Logger:       testlog.New(e.t),
	}
	if e.amqp != nil {
		cfg.AMQPURL, cfg.AMQPPrefix = e.amqp.URL, e.amqp.Prefix
	}
	return cfg
}

func withParam(rawURL, key, value string) string {
	sep := "?"
	if strings.Contains(rawURL, "?") {
		sep = "&"
	}
	return rawURL + sep + key + "=" + value
}

// instance is one process of the service, run in the test's process: its client's Run (unless
// it is an API process) and, unless it is a worker, its HTTP API on an httptest server.
type instance struct {
	svc    *service
	server *httptest.Server
	stop   func()
}

// start opens and runs an instance until the test ends or stop is called.
func (e *testEnv) start(cfg Config) *instance {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := open(ctx, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- svc.run(ctx) }()
	inst := &instance{svc: svc}
	if cfg.Mode.ServesHTTP() {
		inst.server = httptest.NewServer(svc.handler())
	}
	var once sync.Once
	inst.stop = func() {
		once.Do(func() {
			if inst.server != nil {
				inst.server.Close()
			}
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(waitFor):
				t.Errorf("the instance did not stop within %s", waitFor)
			}
			svc.close()
		})
	}
	t.Cleanup(inst.stop)
	if cfg.Mode.RunsWorker() {
		select {
		case <-svc.client.Worker().Running():
		case err := <-done:
			t.Fatalf("the worker stopped at start: %v", err)
		case <-time.After(waitFor):
			t.Fatalf("the worker did not start within %s", waitFor)
		}
	}
	return inst
}

// response is an HTTP response, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to the instance's API and records it for the README check.
func (i *instance) do(t testing.TB, method, path, body string) response {
	t.Helper()
	res, err := i.send(method, path, body)
	require.NoError(t, err)
	return res
}

// send is do for goroutines other than the test's: it reports failures as errors.
func (i *instance) send(method, path, body string) (response, error) {
	if i.server == nil {
		return response{}, errors.New("a worker instance has no HTTP API")
	}
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, i.server.URL+path, r)
	if err != nil {
		return response{}, err
	}
	res, err := i.server.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" && path != "/metrics" { // Prometheus' text format there
		return response{}, fmt.Errorf("%s %s: every response should be JSON, got %q: %s", method, path, ct, b)
	}
	record(method, path, body)
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// call sends a request, requires wantStatus and decodes the JSON answer into out (if not nil).
func (i *instance) call(t testing.TB, method, path, body string, wantStatus int, out any) {
	t.Helper()
	res := i.do(t, method, path, body)
	require.Equal(t, wantStatus, res.status, "%s %s %s → %s", method, path, body, res.body)
	if out != nil {
		require.NoError(t, json.Unmarshal(res.body, out), "%s", res.body)
	}
}

// page GETs an HTML page (the console's) and returns it.
func (i *instance) page(t testing.TB, path string) string {
	t.Helper()
	require.NotNil(t, i.server, "a worker instance has no HTTP API")
	res, err := http.Get(i.server.URL + path)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode, "GET %s → %s", path, body)
	require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	return string(body)
}

// register creates a ticket from a JSON body and returns its id.
func (i *instance) register(t testing.TB, body string) string {
	t.Helper()
	var out struct{ ID string }
	i.call(t, http.MethodPost, "/tickets", body, http.StatusCreated, &out)
	require.NotEmpty(t, out.ID)
	return out.ID
}

func (i *instance) tickets(t testing.TB, query string) []ticketJSON {
	t.Helper()
	var out struct{ Tickets []ticketJSON }
	i.call(t, http.MethodGet, "/tickets"+query, "", http.StatusOK, &out)
	return out.Tickets
}

func (i *instance) stats(t testing.TB) map[string]customerStats {
	t.Helper()
	var out struct{ Customers []customerStats }
	i.call(t, http.MethodGet, "/stats", "", http.StatusOK, &out)
	m := map[string]customerStats{}
	for _, c := range out.Customers {
		m[c.Customer] = c
	}
	return m
}

func (i *instance) status(t testing.TB) statusJSON {
	t.Helper()
	var out statusJSON
	i.call(t, http.MethodGet, "/status", "", http.StatusOK, &out)
	return out
}

// projection returns the named projection's status from a GET /status answer.
func (s statusJSON) projection(t testing.TB, name string) projectionJSON {
	t.Helper()
	for _, p := range s.Projections {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("GET /status has no projection %s: %+v", name, s)
	return projectionJSON{}
}

// waitCaughtUp waits until GET /status says every projection caught up.
func (i *instance) waitCaughtUp(t testing.TB) statusJSON {
	t.Helper()
	var st statusJSON
	require.Eventually(t, func() bool {
		st = i.status(t)
		return st.CaughtUp
	}, waitFor, tick, "every projection catches up")
	return st
}

// Requests the tests sent, normalised as README.md writes them: ticket ids as $ID, the long
// title as $LONG.
var (
	exercisedMu sync.Mutex
	exercised   = map[string]bool{}
	idPattern   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
)

func record(method, path, body string) {
	key := requestKey(method, idPattern.ReplaceAllString(path, "$$ID"), strings.ReplaceAll(body, longTitle, "$LONG"))
	exercisedMu.Lock()
	exercised[key] = true
	exercisedMu.Unlock()
}

func exercisedCount() int {
	exercisedMu.Lock()
	defer exercisedMu.Unlock()
	return len(exercised)
}

func requestKey(method, path, body string) string { return method + " " + path + " " + body }

// checkReadmeExercised fails unless every curl command in the README was sent by a test with
// the same method, path and body.
func checkReadmeExercised(readme string) error {
	cmds, err := readmeCurls(readme)
	if err != nil {
		return err
	}
	exercisedMu.Lock()
	defer exercisedMu.Unlock()
	var missing []string
	for _, c := range cmds {
		if !exercised[c.key()] {
			missing = append(missing, fmt.Sprintf("  line %d: %s", c.line, c.key()))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: curl commands no test sends (same method, path and body):\n%s", readme, strings.Join(missing, "\n"))
	}
	return nil
}
