package amqptest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/nudgeworks/nudge/internal/redact"
)

// Proxy is a TCP proxy in front of the broker, for outages only the clients that connect
// through it see: while it is down it accepts connections and closes them at once (as a port
// whose broker is not up yet), and Cut drops every connection it carries. It is closed when the
// test ends.
type Proxy struct {
	ln     net.Listener
	target string
	url    string

	mu    sync.Mutex
	up    bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy starts a proxy on a free local port that forwards to the broker of brokerURL when up.
func NewProxy(t testing.TB, brokerURL string, up bool) *Proxy {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatalf("amqptest: proxy: broker URL %s is not a valid URL", redact.URL(brokerURL))
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("amqptest: proxy: listen: %v", err)
	}
	u.Host = ln.Addr().String()
	p := &Proxy{ln: ln, target: target, url: u.String(), up: up, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL is the broker URL through the proxy (the same user, password and vhost).
func (p *Proxy) URL() string { return p.url }

// SetUp starts (true) or stops (false) forwarding new connections. Connections already
// forwarded are left alone; Cut drops them.
func (p *Proxy) SetUp(up bool) {
	p.mu.Lock()
	p.up = up
	p.mu.Unlock()
}

// Cut closes every connection the proxy carries, both to the client and to the broker, and
// returns how many it closed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if _, client := c.(*clientConn); client {
			n++
		}
		_ = c.Close()
		delete(p.conns, c)
	}
	return n
}

// clientConn marks the client side of a forwarded connection, for Cut's count.
type clientConn struct{ net.Conn }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if !up {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.forward(&clientConn{c}) })
	}
}

func (p *Proxy) forward(client net.Conn) {
	broker, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(client, broker) {
		return
	}
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// One direction ended: end the other too, like a dropped connection.
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Go(func() { pipe(broker, client) })
	wg.Go(func() { pipe(client, broker) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, broker)
	p.mu.Unlock()
}

// track registers a forwarded pair; false (and both closed) when the proxy is closed.
func (p *Proxy) track(client, broker net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		_ = client.Close()
		_ = broker.Close()
		return false
	}
	p.conns[client], p.conns[broker] = struct{}{}, struct{}{}
	return true
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
