package legacy

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/edgefence/edgefence/transport/modbus"
)

// ServeTCP answers Modbus TCP requests on every connection ln accepts,
// until ctx ends (it closes ln and the connections) or ln fails. A request
// for a unit it does not have gets no answer, as from a lone device.
func (s *Slave) ServeTCP(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("legacy: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c)
		}()
	}
}

// serveConn answers one connection's requests in order.
func (s *Slave) serveConn(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	log := s.logger()
	hdr := make([]byte, modbus.MBAPLen)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		h, n, err := modbus.DecodeMBAP(hdr)
		if err != nil {
			s.dropped(log, err.Error(), hdr)
			return // a stream out of step cannot be resynchronised: drop it
		}
		pdu := make([]byte, n)
		if _, err := io.ReadFull(c, pdu); err != nil {
			return
		}
		d := s.Units[h.Unit]
		if d == nil {
			s.foreign.Add(1)
			continue // a gateway would answer 0x0B; a lone device is silent
		}
		s.requests.Add(1)
		out, err := modbus.EncodeTCP(h, d.Handle(pdu))
		if err != nil {
			continue
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
