package serial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ResponderStats counts a Responder's work.
type ResponderStats struct {
	Requests    uint64 // request frames received
	Applied     uint64 // requests handed to the Handler
	Replayed    uint64 // duplicates answered with the remembered response
	BadMessages uint64 // frames dropped: bad header, or a response
	Unsent      uint64 // responses not sent: too large, or the port was down
	Frames      FrameStats
}

// A Responder is the device side of a Link: it reads requests, applies
// each through Handler once, and writes the responses. Like Allen-Bradley
// DF1's TNS check, it remembers the last request (txid and bytes) and its
// response: a request that repeats both is a retry whose response was lost,
// and gets the remembered response again without calling Handler. Comparing
// the bytes too means that a gateway that restarted and happens to reuse
// the last txid for a different command is not mistaken for a retry.
//
// The memory lives in the Responder, not in one Serve call, so a device
// simulator that serves again after its port came back still recognises
// the retries of the request it applied before. Serve calls must not
// overlap.
type Responder struct {
	// Handler applies a request and returns the response body (nil means
	// an empty response). It must not retain req.
	Handler func(req []byte) []byte

	// MaxPayload is the largest frame payload accepted or sent, header
	// included. Default DefaultMaxPayload. It must match the Link's.
	MaxPayload int

	mu       sync.Mutex // one Serve at a time
	has      bool
	lastTxid uint32
	lastReq  []byte
	lastResp []byte // the encoded response frame

	frames                                   frameCounters
	requests, applied, replayed, bad, unsent atomic.Uint64
}

// Serve answers requests from port until ctx ends or reading fails. It
// returns nil when ctx ends, or the read or write error that stopped it. A
// write that fails with ErrPortDown (a Conn whose port is being reopened) is
// not fatal: the gateway will retry, and the retry gets the remembered
// response.
//
// Reads end when ctx ends if port's Read returns now and then (a Port or
// Conn does, within its ReadTimeout) or port has SetReadDeadline (a
// non-blocking *os.File such as a pty master, a net.Conn): Serve then sets
// a past deadline, and clears it before returning.
func (r *Responder) Serve(ctx context.Context, port io.ReadWriter) error {
	if !r.mu.TryLock() {
		return errors.New("serial: Responder.Serve called while another Serve runs")
	}
	defer r.mu.Unlock()
	if r.Handler == nil {
		return fmt.Errorf("%w: Responder without Handler", ErrInvalidConfig)
	}
	maxPayload := r.MaxPayload
	if maxPayload == 0 {
		maxPayload = DefaultMaxPayload
	}
	if maxPayload <= headerLen || maxPayload > MaxPayloadLimit {
		return fmt.Errorf("%w: MaxPayload %d not in %d..%d", ErrInvalidConfig, maxPayload, headerLen+1, MaxPayloadLimit)
	}
	if d, ok := port.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = d.SetReadDeadline(time.Time{})
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = d.SetReadDeadline(time.Unix(1, 0))
			close(fired)
		})
		defer func() {
			if !stop() {
				<-fired // it may still be setting the deadline
			}
			_ = d.SetReadDeadline(time.Time{})
		}()
	}
	dec := newDecoder(port, maxPayload, &r.frames)
	for ctx.Err() == nil {
		p, err := dec.Next()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if isTimeout(err) {
				continue
			}
			return fmt.Errorf("serial: serve: %w", err)
		}
		frame := r.answer(p, maxPayload)
		if frame == nil {
			continue
		}
		if _, err := port.Write(frame); err != nil {
			r.unsent.Add(1)
			if errors.Is(err, ErrPortDown) {
				continue
			}
			return fmt.Errorf("serial: serve: %w", err)
		}
	}
	return nil
}

// answer returns the response frame for the message p, or nil.
func (r *Responder) answer(p []byte, maxPayload int) []byte {
	h, req, err := parseMessage(p)
	if err != nil || h.typ != typeRequest {
		r.bad.Add(1)
		return nil
	}
	r.requests.Add(1)
	if r.has && h.txid == r.lastTxid && bytes.Equal(req, r.lastReq) {
		r.replayed.Add(1)
		return r.lastResp
	}
	body := r.Handler(req)
	r.applied.Add(1)
	frame, err := encodeMessage(header{typ: typeResponse, txid: h.txid}, body)
	if err != nil || len(body) > maxPayload-headerLen {
		// The request was applied but its answer cannot be sent: remember
		// that, so a retry is not applied again either.
		frame = nil
		r.unsent.Add(1)
	}
	r.has, r.lastTxid, r.lastResp = true, h.txid, frame
	r.lastReq = append(r.lastReq[:0], req...)
	return frame
}

// Stats returns the Responder's counters. It is safe to call while Serve
// runs.
func (r *Responder) Stats() ResponderStats {
	return ResponderStats{
		Requests:    r.requests.Load(),
		Applied:     r.applied.Load(),
		Replayed:    r.replayed.Load(),
		BadMessages: r.bad.Load(),
		Unsent:      r.unsent.Load(),
		Frames:      r.frames.snapshot(),
	}
}

// Serve answers requests from port with handler until ctx ends, as a
// Responder does (see Responder.Serve), with duplicate detection for the
// life of this call.
func Serve(ctx context.Context, port io.ReadWriter, handler func(req []byte) []byte) error {
	r := &Responder{Handler: handler}
	return r.Serve(ctx, port)
}
