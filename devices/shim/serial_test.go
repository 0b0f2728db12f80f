package shim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/serial"
)

// A fence-capable serial device takes the same signed envelope as an MQTT
// one: the gateway's Link sends the COSE_Sign1 bytes in a COBS frame over
// a real pty pair, the device's Responder hands the frame's payload to
// the shim, which verifies before the admit rule. A signed command is
// accepted; an unsigned one with token 2^63 on the same wire is refused
// invalid with the mark unchanged; the holder's next signed command is
// accepted.
func TestSignedEnvelopeOverSerial(t *testing.T) {
	w := newAuthWorld(t)
	pair, err := sandbox.NewPtyPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pair.Close() })
	open := func(path string) *serial.Port {
		p, err := serial.OpenPort(serial.PortConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	gw, dev := open(pair.A), open(pair.B)
	r := &serial.Responder{Handler: func(req []byte) []byte {
		a := w.s.Handle("dev-1", req, w.dev)
		b, err := fence.MarshalAck(&a)
		if err != nil {
			t.Error(err)
		}
		return b
	}}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx, dev) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Serve: %v", err)
		}
	})
	link, err := serial.NewLink(gw, serial.LinkConfig{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	do := func(raw []byte) fence.Ack {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		resp, err := link.Do(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		a, err := fence.UnmarshalAck(resp)
		if err != nil {
			t.Fatal(err)
		}
		return *a
	}

	if a := do(signed(t, w.gw, cmd("dev-1", 5, 1, "c1"))); a.Verdict != fence.Accepted {
		t.Fatalf("signed command over serial: %+v", a)
	}
	forged, err := fence.MarshalEnvelope(cmd("dev-1", 1<<63, 1, "f1"))
	if err != nil {
		t.Fatal(err)
	}
	if a := do(forged); a.Verdict != fence.Invalid || a.Mark() != (fence.Mark{Token: 5, Seq: 1}) {
		t.Fatalf("unsigned token 2^63 over serial: %+v, want invalid with the mark 5/1", a)
	}
	if a := do(signed(t, w.gw, cmd("dev-1", 5, 2, "c2"))); a.Verdict != fence.Accepted {
		t.Fatalf("the holder's next command over serial: %+v", a)
	}
	if m, err := w.s.Mark("dev-1"); err != nil || m != (fence.Mark{Token: 5, Seq: 2}) {
		t.Fatalf("mark %v %v, want 5/2", m, err)
	}
}
