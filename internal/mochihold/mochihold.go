// Package mochihold holds back chosen PUBLISH packets in an in-process
// mochi broker until a test releases them: the publisher gets its PUBACK
// at once (the broker has the message) and the subscribers get it only at
// Release — a slow link between a device and the agent, as when a home
// gateway's Modbus write needed a bus retry and its ack came after the
// agent's first wait for it.
package mochihold

import (
	"errors"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Hold is the hook of one server: it holds the first n PUBLISH packets on
// its topic.
type Hold struct {
	mochi.HookBase
	srv   *mochi.Server
	cl    *mochi.Client // inline: delivers the held packets, past this hook
	topic string

	mu   sync.Mutex
	n    int // how many more to hold
	held []packets.Packet
	seen chan struct{} // closed and replaced when one is held
}

// Add adds to srv a Hold of the first n PUBLISH packets on topic (an exact
// topic name) and returns it.
func Add(srv *mochi.Server, topic string, n int) (*Hold, error) {
	h := &Hold{srv: srv, cl: srv.NewClient(nil, mochi.LocalListener, "mochihold", true), topic: topic, n: n,
		seen: make(chan struct{})}
	return h, srv.AddHook(h, nil)
}

// ID implements mochi.Hook.
func (h *Hold) ID() string { return "mochihold" }

// Provides implements mochi.Hook.
func (h *Hold) Provides(b byte) bool { return b == mochi.OnPublish }

// OnPublish implements mochi.Hook: a packet to hold is kept and ignored
// (acknowledged, delivered to no one).
func (h *Hold) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline || pk.TopicName != h.topic {
		return pk, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n <= 0 {
		return pk, nil
	}
	h.n--
	c := pk.Copy(false)
	c.FixedHeader.Retain, c.FixedHeader.Dup = false, false
	c.PacketID = 1 // required for QoS > 0; subscribers get their own ids
	c.Properties.TopicAlias, c.Properties.TopicAliasFlag = 0, false
	h.held = append(h.held, c)
	close(h.seen)
	h.seen = make(chan struct{})
	return pk, packets.CodeSuccessIgnore
}

// Held returns how many packets are held now, and a channel closed when
// the next one is.
func (h *Hold) Held() (int, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held), h.seen
}

// Release delivers the held packets to their subscribers, in the order
// they came, and holds no more.
func (h *Hold) Release() error {
	h.mu.Lock()
	held := h.held
	h.held, h.n = nil, 0
	h.mu.Unlock()
	var errs []error
	for _, pk := range held {
		errs = append(errs, h.srv.InjectPacket(h.cl, pk))
	}
	return errors.Join(errs...)
}
