package amqptest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

func dial(t *testing.T, rawURL, name string) *amqp091.Connection {
	t.Helper()
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp091.DialConfig(rawURL, amqp091.Config{Properties: props})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// exists reports whether the queue or exchange exists, with a passive declare.
func exists(t *testing.T, conn *amqp091.Connection, queue bool, name string) bool {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	if queue {
		_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	} else {
		err = ch.ExchangeDeclarePassive(name, "fanout", true, false, false, false, nil)
	}
	if err == nil {
		return true
	}
	var amqpErr *amqp091.Error
	require.ErrorAs(t, err, &amqpErr)
	require.Equal(t, amqp091.NotFound, amqpErr.Code, err)
	return false
}

func TestNewGivesAPrefixAndDeletesWhatItNames(t *testing.T) {
	t.Parallel()
	a, b := amqptest.New(t), amqptest.New(t)
	require.NotEqual(t, a.Prefix, b.Prefix)
	require.Contains(t, a.ConnectionName, a.Prefix)

	conn := dial(t, a.URL, "amqptest-test")
	var queue, exchange, other string
	t.Run("declares", func(t *testing.T) {
		env := amqptest.New(t)
		queue, exchange, other = env.Prefix+"q", env.Prefix+"x", b.Prefix+"q"
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
		require.NoError(t, err)
		_, err = ch.QueueDeclare(other, true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.ExchangeDeclare(exchange, "fanout", true, false, false, false, nil))
		require.NoError(t, ch.QueueBind(queue, "", exchange, false, nil))
	})
	if !haveRabbitmqctl() {
		t.Skip("no rabbitmqctl: the subtest's queues stay on the broker")
	}
	require.False(t, exists(t, conn, true, queue), "the subtest's queue is gone once it ended")
	require.False(t, exists(t, conn, false, exchange), "the subtest's exchange is gone once it ended")
	require.True(t, exists(t, conn, true, other), "another test's queue stays")
}

// haveRabbitmqctl reports whether amqptest finds a rabbitmqctl command to run.
func haveRabbitmqctl() bool {
	candidates := []string{amqptest.RabbitmqctlDefault, amqptest.RabbitmqctlDocker}
	if env := os.Getenv("NUDGE_TEST_RABBITMQCTL"); env != "" {
		candidates = []string{env}
	}
	for _, c := range candidates {
		if _, err := exec.LookPath(strings.Fields(c)[0]); err == nil {
			return true
		}
	}
	return false
}

func TestCloseConnectionsClosesOnlyThisTestsConnections(t *testing.T) {
	t.Parallel()
	env, other := amqptest.New(t), amqptest.New(t)
	mine := dial(t, env.URL, env.ConnectionName)
	mine2 := dial(t, env.URL, env.Prefix+"second")
	theirs := dial(t, other.URL, other.ConnectionName)
	closed := mine.NotifyClose(make(chan *amqp091.Error, 1))

	require.Equal(t, 2, env.CloseConnections(t))
	select {
	case err := <-closed:
		require.NotNil(t, err, "closed by the broker, not by the client")
		require.Equal(t, amqp091.ConnectionForced, err.Code)
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the connection was not closed")
	}
	require.Eventually(t, mine2.IsClosed, testwait.For(time.Minute), 10*time.Millisecond)
	require.False(t, theirs.IsClosed(), "another test's connection stays open")
	ch, err := theirs.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Close())
}

func TestProxy(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	p := amqptest.NewProxy(t, env.URL, false)
	require.NotEqual(t, env.URL, p.URL())

	_, err := amqp091.Dial(p.URL())
	require.Error(t, err, "a proxy that is down refuses the AMQP handshake")

	p.SetUp(true)
	conn := dial(t, p.URL(), env.ConnectionName)
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(env.Prefix+"via-proxy", false, true, false, false, nil)
	require.NoError(t, err)

	p.SetUp(false)
	require.Equal(t, 1, p.Cut())
	select {
	case err := <-closed:
		require.NotNil(t, err, "a cut connection fails with an error")
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the cut connection was not noticed")
	}
	_, err = amqp091.Dial(p.URL())
	require.Error(t, err)
}

// TestUnreachableServer runs this test binary again against a port nothing listens on: without
// CI the test is skipped with a hint, with CI=true it fails.
func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	if os.Getenv("AMQPTEST_CHILD") == "1" {
		amqptest.New(t)
		return
	}
	run := func(ci string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableServer$", "-test.v")
		cmd.Env = append(os.Environ(), "AMQPTEST_CHILD=1", "CI="+ci,
			"NUDGE_TEST_AMQP_URL=amqp://guest:secret@127.0.0.1:1/")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- SKIP")
	require.Contains(t, out, "make up")
	require.NotContains(t, out, "secret", "the password is never printed")

	out, err = run("true")
	require.Error(t, err, out)
	require.Contains(t, out, "--- FAIL")
	require.Contains(t, out, "is not reachable")
	require.NotContains(t, out, "secret")
}
