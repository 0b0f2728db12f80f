package sandbox

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// CutProxy forwards TCP from a loopback address to a target until it is
// cut: then it drops every connection and refuses new ones, until Heal
// listens again on the same address. Tests put it between a client and a
// server (an etcd client and etcd) to cut one process off without touching
// the others.
type CutProxy struct {
	addr, target string

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// StartCutProxy listens on a free 127.0.0.1 port and forwards to target
// ("HOST:PORT"). Close it when done.
func StartCutProxy(target string) (*CutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sandbox: cut proxy: %w", err)
	}
	p := &CutProxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's address, "127.0.0.1:PORT"; it stays the same across
// Cut and Heal.
func (p *CutProxy) Addr() string { return p.addr }

func (p *CutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln { // cut while dialing
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			p.wg.Go(func() { pipe(u, c) })
			p.wg.Go(func() { pipe(c, u) })
		}
	})
}

// Cut drops every connection and stops listening; it returns once every
// forwarding goroutine has ended. Cutting a cut proxy does nothing.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

// Heal listens again on the same address.
func (p *CutProxy) Heal() error {
	p.mu.Lock()
	up := p.ln != nil
	p.mu.Unlock()
	if up {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("sandbox: cut proxy heal: %w", err)
	}
	p.serve(ln)
	return nil
}

// Close cuts the proxy for good.
func (p *CutProxy) Close() error {
	p.Cut()
	return nil
}
