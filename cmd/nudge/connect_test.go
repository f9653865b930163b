package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// silentListener returns the address of a server that accepts connections and never answers,
// like a host behind a firewall that drops the handshake.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestUnreachableBrokerFailsLikeTheDatabase: a broker that refuses the connection, or never
// answers, fails the command after one attempt bounded by the database's connect timeout, with
// a message in terms of the command line; the database fails the same way.
func TestUnreachableBrokerFailsLikeTheDatabase(t *testing.T) {
	t.Parallel()
	c := &cli{g: globals{amqp: "amqp://h/"}}
	cfg := c.amqpConfig()
	require.Equal(t, connectTimeout, cfg.StartupTimeout, "the broker's connect is bounded like the database's")
	require.Equal(t, 1, cfg.StartupAttempts, "and tried once, like the database")

	const password = "s3cr3t-Pa55"
	f := newFixture(t)
	refused, silent := "127.0.0.1:"+closedPort(t), silentListener(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"database refuses", map[string]string{envDatabaseURL: "postgres://ops:" + password + "@" + refused + "/x?sslmode=disable"},
			"cannot reach PostgreSQL at " + refused},
		{"database silent", map[string]string{envDatabaseURL: "postgres://ops:" + password + "@" + silent + "/x?sslmode=disable"},
			"cannot reach PostgreSQL at " + silent},
		{"broker refuses", map[string]string{envDatabaseURL: f.db.URL, envAMQPURL: "amqp://ops:" + password + "@" + refused + "/"},
			"cannot connect to RabbitMQ at amqp://ops:xxxxx@" + refused + "/ (1 attempt"},
		{"broker silent", map[string]string{envDatabaseURL: f.db.URL, envAMQPURL: "amqp://ops:" + password + "@" + silent + "/"},
			"cannot connect to RabbitMQ at amqp://ops:xxxxx@" + silent + "/ (1 attempt in "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			start := time.Now()
			code := run(context.Background(), []string{"deadletter", "replay", "--all"}, &stdout, &stderr,
				func(k string) string { return tc.env[k] })
			took := time.Since(start)
			t.Logf("exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(stderr.String()))
			require.Equal(t, 1, code, stderr.String())
			require.Contains(t, stderr.String(), tc.want)
			require.NotContains(t, stderr.String()+stdout.String(), password)
			require.NotContains(t, stderr.String(), "Config.", "the message speaks of flags")
			require.Less(t, took, time.Minute, "it gives up by itself")
		})
	}
}
