// Package mochiquota keeps the in-process test and sandbox broker, mochi
// v2.7.9, out of its send quota: a hook that takes the Receive Maximum out
// of every CONNECT before mochi reads it.
//
// Our MQTT clients announce a Receive Maximum (transport/mqtt: 8,192; paho
// sizes a channel of that many slots per connection, 512 KiB at the spec's
// default of 65,535). mochi v2.7.9 then counts a send quota for the
// client, and its accounting stalls deliveries: `make test` hung 15 min in
// cmd/edgefence-devsim TestFirmwareInProcess with the property announced
// (docs/BENCHMARKS.md §74, §80). Without it mochi keeps no quota and caps
// what it holds in flight for a client at its MaximumInflight, 8,192 — what
// it did before our clients announced one. Real brokers (Mosquitto's
// interop tests among ours) see and honour the property.
package mochiquota

import (
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Hook removes the Receive Maximum from every CONNECT, remembering what
// each client announced (Announced).
type Hook struct {
	mochi.HookBase

	mu   sync.Mutex
	seen map[string]uint16 // client id → its CONNECT's Receive Maximum
}

// Add adds a Hook to srv and returns it.
func Add(srv *mochi.Server) (*Hook, error) {
	h := &Hook{seen: map[string]uint16{}}
	return h, srv.AddHook(h, nil)
}

// ID implements mochi.Hook.
func (h *Hook) ID() string { return "mochiquota" }

// Provides implements mochi.Hook.
func (h *Hook) Provides(b byte) bool { return b == mochi.OnPacketRead }

// OnPacketRead implements mochi.Hook: a CONNECT loses its Receive Maximum.
func (h *Hook) OnPacketRead(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Connect {
		h.mu.Lock()
		h.seen[pk.Connect.ClientIdentifier] = pk.Properties.ReceiveMaximum
		h.mu.Unlock()
		pk.Properties.ReceiveMaximum = 0
	}
	return pk, nil
}

// Announced returns the Receive Maximum client announced in its last
// CONNECT (0: none), and whether it connected at all.
func (h *Hook) Announced(client string) (uint16, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rm, ok := h.seen[client]
	return rm, ok
}
