// Package amqptest gives each test its own corner of a RabbitMQ broker: a unique name prefix
// for the exchanges and queues it declares (deleted when the test ends), a connection name to
// give its clients, and ways to simulate an outage that only this test's clients see.
//
// The broker comes from NUDGE_TEST_AMQP_URL (default URLDefault). If it cannot be reached, the
// test is skipped with a message saying how to start it — unless CI=true, where an unreachable
// broker fails the test. Passwords are never printed.
//
// Listing what a test declared and force-closing connections need rabbitmqctl: the command
// comes from NUDGE_TEST_RABBITMQCTL, else RabbitmqctlDefault when it is on the PATH, else
// RabbitmqctlDocker (the docker compose broker of `make up`) when docker is. Without one, a
// test's queues and exchanges are left on the broker (a log line says so) and CloseConnections
// skips the test (fails it when CI=true).
package amqptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// URLDefault is the broker used when NUDGE_TEST_AMQP_URL is not set.
const URLDefault = "amqp://guest:guest@127.0.0.1:5672/"

// The rabbitmqctl commands tried, in this order, when NUDGE_TEST_RABBITMQCTL is not set.
const (
	RabbitmqctlDefault = "rabbitmqctl"
	RabbitmqctlDocker  = "docker compose exec -T rabbitmq rabbitmqctl"
)

// namePrefix starts every prefix this package hands out: nudge_test.<unix seconds>.<random>.
const namePrefix = "nudge_test."

// staleAfter is the age after which leftovers of a killed run are deleted.
const staleAfter = 2 * time.Hour

// dialTimeout bounds every connection this package opens itself (scaled by testwait: a busy
// broker answers slowly).
var dialTimeout = testwait.For(30 * time.Second)

// URL returns the test broker's URL.
func URL() string {
	if u := os.Getenv("NUDGE_TEST_AMQP_URL"); u != "" {
		return u
	}
	return URLDefault
}

// Env is one test's share of the broker.
type Env struct {
	// URL connects to the broker.
	URL string
	// Prefix is unique to the test (e.g. "nudge_test.1763800000.a1b2c3d4."). Start the name of
	// every exchange and queue the test declares with it: those left when the test ends are
	// deleted.
	Prefix string
	// ConnectionName is a connection name (amqp091 Config.Properties "connection_name")
	// starting with Prefix, for the test's clients; CloseConnections closes every connection
	// whose name starts with Prefix.
	ConnectionName string
}

var (
	reachOnce sync.Once
	reachErr  error
)

// New checks that the broker answers and returns a new Env for t. When t ends, the exchanges
// and queues whose names start with the Env's Prefix are deleted.
func New(t testing.TB) *Env {
	t.Helper()
	reachOnce.Do(func() {
		var conn *amqp091.Connection
		conn, reachErr = dial(URL(), "nudge_test.check")
		if reachErr == nil {
			reachErr = conn.Close()
		}
	})
	if reachErr != nil {
		msg := fmt.Sprintf("amqptest: RabbitMQ at %s is not reachable: %s\n"+
			"Start it with `make up` (or scripts/services.sh), or point NUDGE_TEST_AMQP_URL at a broker.",
			redact.URL(URL()), redact.Message(reachErr.Error(), URL()))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	prefix := fmt.Sprintf("%s%d.%s.", namePrefix, time.Now().Unix(), randomHex(4))
	env := &Env{URL: URL(), Prefix: prefix, ConnectionName: prefix + "client"}
	t.Cleanup(func() { env.deleteTopology(t) })
	return env
}

// CloseConnections makes the broker close every connection whose name starts with the Env's
// Prefix, as an outage would, without touching any other client, and returns how many it
// closed. It skips the test when rabbitmqctl is not available (fails it when CI=true).
func (e *Env) CloseConnections(t testing.TB) int {
	t.Helper()
	out, err := rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "client_properties")
	if err != nil {
		needRabbitmqctl(t, err)
	}
	var pids []string
	for _, line := range strings.Split(out, "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		m := connectionNamePattern.FindStringSubmatch(props)
		if m != nil && strings.HasPrefix(m[1], e.Prefix) {
			pids = append(pids, strings.TrimSpace(pid))
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pids))
	for i, pid := range pids {
		wg.Go(func() {
			_, errs[i] = rabbitmqctl("close_connection", pid, "amqptest: simulated outage")
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("amqptest: close connection: %v", err)
		}
	}
	return len(pids)
}

// Connection is one of the test's connections as the broker lists it.
type Connection struct {
	// Name is the connection's name (its "connection_name" client property).
	Name string
	// Channels is the number of channels open on it.
	Channels int
}

// Connections lists the broker's connections whose name starts with the Env's Prefix. It skips
// the test when rabbitmqctl is not available (fails it when CI=true).
func (e *Env) Connections(t testing.TB) []Connection {
	t.Helper()
	out, err := rabbitmqctl("list_connections", "-q", "--no-table-headers", "channels", "client_properties")
	if err != nil {
		needRabbitmqctl(t, err)
	}
	var conns []Connection
	for _, line := range strings.Split(out, "\n") {
		channels, props, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		m := connectionNamePattern.FindStringSubmatch(props)
		if m == nil || !strings.HasPrefix(m[1], e.Prefix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(channels))
		if err != nil {
			t.Fatalf("amqptest: list_connections: channels %q: %v", channels, err)
		}
		conns = append(conns, Connection{Name: m[1], Channels: n})
	}
	return conns
}

// connectionNamePattern finds the connection name in rabbitmqctl's client_properties column:
// [{"product","AMQP 0.9.1 Client"},…,{"connection_name","…"},…].
var connectionNamePattern = regexp.MustCompile(`\{"connection_name","([^"]*)"\}`)

// deleteTopology deletes the queues and exchanges named with the Env's prefix, and those of
// runs older than staleAfter that were killed before their cleanup.
func (e *Env) deleteTopology(t testing.TB) {
	queues, exchanges, err := listTopology(time.Now())
	if err != nil {
		t.Logf("amqptest: queues and exchanges starting with %q are left on the broker: %v "+
			"(set NUDGE_TEST_RABBITMQCTL to a working rabbitmqctl command to delete them)", e.Prefix, err)
		return
	}
	queues, exchanges = e.filter(queues), e.filter(exchanges)
	if len(queues) == 0 && len(exchanges) == 0 {
		return
	}
	conn, err := dial(e.URL, "nudge_test.cleanup")
	if err != nil {
		t.Errorf("amqptest: delete queues and exchanges starting with %q: %s", e.Prefix, redact.Message(err.Error(), e.URL))
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("amqptest: open channel: %v", err)
		return
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Errorf("amqptest: delete queue %s: %v", q, err)
			return
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Errorf("amqptest: delete exchange %s: %v", x, err)
			return
		}
	}
}

// filter keeps the names of this Env and stale ones.
func (e *Env) filter(names []string) []string {
	var keep []string
	for _, n := range names {
		if strings.HasPrefix(n, e.Prefix) || stale(n) {
			keep = append(keep, n)
		}
	}
	return keep
}

// stale reports whether name was made by this package more than staleAfter ago.
func stale(name string) bool {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return false
	}
	stamp, _, _ := strings.Cut(rest, ".")
	sec, err := strconv.ParseInt(stamp, 10, 64)
	return err == nil && time.Since(time.Unix(sec, 0)) > staleAfter
}

// listing is one run of rabbitmqctl's list_queues and list_exchanges.
type listing struct {
	started   time.Time
	queues    []string
	exchanges []string
	err       error
}

var (
	listMu   sync.Mutex
	lastList *listing
)

// listTopology returns the names of all queues and exchanges of the vhost as they were at some
// moment after since. rabbitmqctl takes half a second of CPU, so cleanups that run together
// share one listing.
func listTopology(since time.Time) (queues, exchanges []string, err error) {
	listMu.Lock()
	defer listMu.Unlock()
	if l := lastList; l != nil && l.started.After(since) {
		return l.queues, l.exchanges, l.err
	}
	l := &listing{started: time.Now()}
	var wg sync.WaitGroup
	var qerr, xerr error
	wg.Go(func() {
		var out string
		out, qerr = rabbitmqctl("list_queues", "-q", "--no-table-headers", "-p", vhost(URL()), "name")
		l.queues = strings.Fields(out)
	})
	wg.Go(func() {
		var out string
		out, xerr = rabbitmqctl("list_exchanges", "-q", "--no-table-headers", "-p", vhost(URL()), "name")
		l.exchanges = strings.Fields(out)
	})
	wg.Wait()
	if qerr != nil {
		l.err = qerr
	} else if xerr != nil {
		l.err = xerr
	}
	lastList = l
	return l.queues, l.exchanges, l.err
}

// rabbitmqctl runs the rabbitmqctl command with args and returns its standard output.
func rabbitmqctl(args ...string) (string, error) {
	command, err := rabbitmqctlCommand()
	if err != nil {
		return "", err
	}
	// rabbitmqctl starts an Erlang VM: seconds on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, command[0], append(command[1:], args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", strings.Join(command, " "), args[0], err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// rabbitmqctlCommand returns the rabbitmqctl command to run, split into words.
func rabbitmqctlCommand() ([]string, error) {
	if env := strings.Fields(os.Getenv("NUDGE_TEST_RABBITMQCTL")); len(env) > 0 {
		if _, err := exec.LookPath(env[0]); err != nil {
			return nil, fmt.Errorf("NUDGE_TEST_RABBITMQCTL: %w", err)
		}
		return env, nil
	}
	for _, candidate := range []string{RabbitmqctlDefault, RabbitmqctlDocker} {
		command := strings.Fields(candidate)
		if _, err := exec.LookPath(command[0]); err == nil {
			return command, nil
		}
	}
	return nil, fmt.Errorf("neither %s nor docker is on the PATH", RabbitmqctlDefault)
}

func needRabbitmqctl(t testing.TB, err error) {
	t.Helper()
	msg := fmt.Sprintf("amqptest: this test needs rabbitmqctl: %v\n"+
		"Install RabbitMQ's CLI or set NUDGE_TEST_RABBITMQCTL (e.g. \"docker compose exec -T rabbitmq rabbitmqctl\").", err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// dial opens a connection named name with a short timeout.
func dial(rawURL, name string) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	if _, err := url.Parse(rawURL); err != nil {
		return nil, fmt.Errorf("NUDGE_TEST_AMQP_URL is not a valid URL (percent-encode reserved characters in the user and password)")
	}
	return amqp091.DialConfig(rawURL, amqp091.Config{Properties: props, Dial: amqp091.DefaultDial(dialTimeout)})
}

// vhost returns the virtual host of an AMQP URL ("/" when it names none).
func vhost(rawURL string) string {
	uri, err := amqp091.ParseURI(rawURL)
	if err != nil || uri.Vhost == "" {
		return "/"
	}
	return uri.Vhost
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// QueueExists reports whether queue exists on the test's broker, looked up passively on a
// connection of its own, so it creates nothing.
func (e *Env) QueueExists(t testing.TB, queue string) bool {
	t.Helper()
	conn, err := amqp091.Dial(e.URL)
	if err != nil {
		t.Fatalf("amqptest: dial: %v", err)
	}
	defer func() { _ = conn.Close() }()
	raw, err := conn.Channel()
	if err != nil {
		t.Fatalf("amqptest: open a channel: %v", err)
	}
	_, err = raw.QueueDeclarePassive(queue, true, false, false, false, nil)
	var amqpErr *amqp091.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp091.NotFound {
		return false
	}
	if err != nil {
		t.Fatalf("amqptest: look up queue %s: %v", queue, err)
	}
	return true
}
