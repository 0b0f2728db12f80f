package mochiquota_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgefence/edgefence/internal/mochiquota"
)

// TestMochiSeesNoReceiveMaximum: a client announces a Receive Maximum;
// mochi's client record holds none (so it keeps no send quota), and the
// hook tells what was announced.
func TestMochiSeesNoReceiveMaximum(t *testing.T) {
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	h, err := mochiquota.Add(srv)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	rm := uint16(5)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "c1", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}}); err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(&paho.Disconnect{})

	if got, ok := h.Announced("c1"); !ok || got != rm {
		t.Errorf("Announced(c1) = %d, %v; want %d, true", got, ok, rm)
	}
	if _, ok := h.Announced("nobody"); ok {
		t.Error("Announced(nobody): a client that never connected")
	}
	cl, ok := srv.Clients.Get("c1")
	if !ok {
		t.Fatal("mochi has no client c1")
	}
	if got := cl.Properties.Props.ReceiveMaximum; got != 0 {
		t.Errorf("mochi's record of c1 has Receive Maximum %d, want none", got)
	}
}
