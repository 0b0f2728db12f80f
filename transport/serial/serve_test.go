package serial

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestResponderDuplicates: the rules of duplicate detection, on messages.
func TestResponderDuplicates(t *testing.T) {
	h := newCounting(echo)
	r := &Responder{Handler: h.Handle}
	msg := func(txid uint32, body string) []byte {
		return appendMessage(nil, header{typ: typeRequest, txid: txid}, []byte(body))
	}
	steps := []struct {
		name    string
		msg     []byte
		applied bool // the handler runs (else the last response is replayed)
	}{
		{"first", msg(7, "a"), true},
		{"retry: same txid, same bytes", msg(7, "a"), false},
		{"retry again", msg(7, "a"), false},
		{"same bytes, new txid: a new command", msg(8, "a"), true},
		{"same txid, other bytes: a restarted gateway, a new command", msg(8, "b"), true},
		{"retry of that", msg(8, "b"), false},
		{"an older txid is not remembered", msg(7, "a"), true},
	}
	for _, st := range steps {
		before := h.calls.Load()
		frame := r.answer(st.msg, DefaultMaxPayload)
		if got := h.calls.Load() > before; got != st.applied {
			t.Fatalf("%s: applied %v, want %v", st.name, got, st.applied)
		}
		want, _ := encodeMessage(header{typ: typeResponse, txid: mustHeader(t, st.msg).txid}, echo(st.msg[headerLen:]))
		if !bytes.Equal(frame, want) {
			t.Fatalf("%s: response %x, want %x", st.name, frame, want)
		}
	}
	if s := r.Stats(); s.Requests != 7 || s.Applied != 4 || s.Replayed != 3 {
		t.Errorf("stats %+v", s)
	}
	// Not requests: dropped.
	if f := r.answer(appendMessage(nil, header{typ: typeResponse, txid: 1}, nil), DefaultMaxPayload); f != nil {
		t.Errorf("answered a response")
	}
	if f := r.answer([]byte{1, 1, 0}, DefaultMaxPayload); f != nil {
		t.Errorf("answered a short message")
	}
	if s := r.Stats(); s.BadMessages != 2 {
		t.Errorf("BadMessages = %d", s.BadMessages)
	}
}

func mustHeader(t *testing.T, msg []byte) header {
	t.Helper()
	h, _, err := parseMessage(msg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestResponderTooLargeResponse: a response that does not fit is not sent,
// and its request is still remembered as applied.
func TestResponderTooLargeResponse(t *testing.T) {
	h := newCounting(func([]byte) []byte { return make([]byte, 100) })
	r := &Responder{Handler: h.Handle, MaxPayload: 64}
	req := appendMessage(nil, header{typ: typeRequest, txid: 1}, []byte("x"))
	for range 2 {
		if f := r.answer(req, 64); f != nil {
			t.Fatal("sent an oversize response")
		}
	}
	if s := r.Stats(); s.Applied != 1 || s.Replayed != 1 || s.Unsent != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestServeStops: Serve on a pty master returns nil when its context ends,
// even with no traffic (the read deadline interrupts the read), and
// Serve on a Port returns at its next read timeout.
func TestServeStops(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	p, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for name, port := range map[string]interface {
		Read([]byte) (int, error)
		Write([]byte) (int, error)
	}{"master": m, "port": p} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, port, echo) }()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Serve = %v, want nil", name, err)
			}
		case <-time.After(testDeadline):
			t.Fatalf("%s: Serve did not stop", name)
		}
	}
	// The master's deadline was cleared: it still works.
	if _, err := p.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, m, 2); string(got) != "hi" {
		t.Fatalf("master read %q", got)
	}
}

func TestServeErrors(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	if err := Serve(context.Background(), m, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Serve without handler = %v", err)
	}
	r := &Responder{Handler: echo, MaxPayload: 3}
	if err := r.Serve(context.Background(), m); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Serve with MaxPayload 3 = %v", err)
	}
	// A read failure ends Serve with the error.
	r = &Responder{Handler: echo}
	done := make(chan error, 1)
	go func() { done <- r.Serve(context.Background(), m) }()
	a.Unplug()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Serve on a closed master returned nil")
		}
	case <-time.After(testDeadline):
		t.Fatal("Serve did not return")
	}
}
