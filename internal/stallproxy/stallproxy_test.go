package stallproxy_test

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/nudgeworks/nudge/internal/stallproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every line it reads with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes line on c and reads the answer, giving up at the read deadline.
func roundTrip(c net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// TestStallHoldsBytesAndKeepsConnectionsOpen: a stalled proxy accepts connections, keeps them
// open and forwards nothing — a read times out rather than failing with a reset or EOF — and
// after Resume the bytes held arrive and traffic flows again, on old and new connections.
func TestStallHoldsBytesAndKeepsConnectionsOpen(t *testing.T) {
	p, err := stallproxy.Start(echoServer(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	r := bufio.NewReader(c)
	got, err := roundTrip(c, r, "one\n", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "one\n", got)

	p.Stall()
	require.True(t, p.Stalled())
	_, err = roundTrip(c, r, "two\n", 100*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "a stalled connection stays open: the read times out")
	require.True(t, ne.Timeout())

	fresh, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "a stalled proxy still accepts connections")
	defer func() { _ = fresh.Close() }()
	fr := bufio.NewReader(fresh)
	_, err = roundTrip(fresh, fr, "three\n", 100*time.Millisecond)
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())

	p.Resume()
	require.False(t, p.Stalled())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "two\n", got, "the bytes held during the stall arrive after Resume")
	got, err = roundTrip(c, r, "four\n", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "four\n", got)
	require.NoError(t, fresh.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err = fr.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "three\n", got)
}

// TestCloseWhileStalled: Close ends stalled connections and returns.
func TestCloseWhileStalled(t *testing.T) {
	p, err := stallproxy.Start(echoServer(t))
	require.NoError(t, err)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	p.Stall()
	_, err = c.Write([]byte("held\n"))
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = bufio.NewReader(c).ReadString('\n')
	require.Error(t, err, "the client sees its connection end")
	var ne net.Error
	if errors.As(err, &ne) {
		require.False(t, ne.Timeout(), "ended by Close, not by the read deadline")
	}
	require.NoError(t, p.Close(), "a second Close does nothing")
}
