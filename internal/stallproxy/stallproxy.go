// Package stallproxy is a TCP proxy for tests that can stall: while stalled it keeps accepting
// connections and keeps every connection open, but forwards no byte in either direction, the
// way a network partition looks to both ends (no refusal, no reset: reads just never return).
// Bytes read while stalled are held and forwarded once it resumes, as TCP retransmission would
// deliver them after the partition heals.
package stallproxy

import (
	"fmt"
	"net"
	"sync"
)

// Proxy forwards the connections it accepts to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	flowing chan struct{} // closed while bytes flow; open (blocking) while stalled
	closed  bool
	conns   map[net.Conn]struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and forwards every connection to target
// (host:port). Close it when done.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("stallproxy: listen: %w", err)
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{ln: ln, target: target, flowing: flowing, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr returns the proxy's address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the proxy's port.
func (p *Proxy) Port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) } //nolint:gosec // a TCP port fits.

// Stall stops forwarding on every connection, open and new, until Resume. Connections stay
// open and new ones are still accepted.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default: // already stalled
	}
}

// Resume forwards again, the bytes held during the stall first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
}

// Stalled reports whether the proxy is stalled.
func (p *Proxy) Stalled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		return false
	default:
		return true
	}
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.serve(client) })
	}
}

// track registers c to be closed by Close; it reports false (and closes c) after Close.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

// serve forwards one accepted connection both ways.
func (p *Proxy) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(server, client) })
	p.pipe(client, server)
	wg.Wait()
}

// pipe copies from src to dst, holding each chunk while the proxy is stalled. When src ends it
// closes dst (after the chunks held), so the other direction ends too.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.wait() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a closed connection: either way this direction is over
			return
		}
	}
}

// wait blocks while the proxy is stalled; it reports false once the proxy is closed.
func (p *Proxy) wait() bool {
	p.mu.Lock()
	flowing := p.flowing
	p.mu.Unlock()
	select {
	case <-flowing:
		return true
	case <-p.done:
		return false
	}
}
