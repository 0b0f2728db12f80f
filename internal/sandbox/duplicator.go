package sandbox

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// DuplicateConfig says which inbound PUBLISH packets a Duplicator delivers
// twice. The zero value duplicates nothing.
type DuplicateConfig struct {
	// Probability is the chance, from 0 to 1, that a matching QoS 1 or 2
	// PUBLISH is delivered to its subscribers a second time. 1 duplicates
	// every matching one.
	Probability float64
	// Topics are MQTT topic filters ("+" and "#" allowed); a PUBLISH
	// matches if its topic matches any. Empty means every topic.
	Topics []string
	// Delay is how long after the original the duplicate is delivered; 0
	// delivers it right after. A delay lets later messages overtake it,
	// like a redelivery after a reconnect.
	Delay time.Duration
	// Seed seeds the random choice; 0 picks a random seed.
	Seed uint64
}

// Duplicator injects QoS 1 duplicates into an in-process mochi broker: a
// matching PUBLISH from a client is delivered to every subscriber as usual
// and then once more — same topic, payload and properties (correlation
// data, user properties), same QoS, a fresh packet id — exactly what a
// subscriber sees when a publisher retransmits after a lost PUBACK.
// Publishes injected by the broker itself (Server.Publish) are never
// duplicated.
//
// Attach it to each server a Broker starts:
//
//	d := sandbox.NewDuplicator(sandbox.DuplicateConfig{Probability: 1, Topics: []string{"edgefence/dev/+/cmd"}})
//	b, err := sandbox.StartBroker(sandbox.BrokerConfig{Setup: d.Attach})
type Duplicator struct {
	mu  sync.Mutex
	cfg DuplicateConfig
	rng *rand.Rand

	n atomic.Int64
}

// NewDuplicator returns a Duplicator with cfg; attach it with Attach.
func NewDuplicator(cfg DuplicateConfig) *Duplicator {
	d := &Duplicator{}
	d.Set(cfg)
	return d
}

// Set replaces the configuration, e.g. to switch duplication on and off
// during a test. It does not affect duplicates already scheduled.
func (d *Duplicator) Set(cfg DuplicateConfig) {
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg = cfg
	d.cfg.Topics = append([]string(nil), cfg.Topics...)
	d.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Duplicated returns how many duplicates have been delivered.
func (d *Duplicator) Duplicated() int64 { return d.n.Load() }

// Attach adds the duplicating hook to srv; it fits BrokerConfig.Setup.
// The hook's pending delayed duplicates are dropped when srv closes.
func (d *Duplicator) Attach(srv *mqtt.Server) error {
	h := &dupHook{d: d, srv: srv, stop: make(chan struct{}),
		cl: srv.NewClient(nil, mqtt.LocalListener, "edgefence-duplicator", true)}
	if err := srv.AddHook(h, nil); err != nil {
		return fmt.Errorf("sandbox: duplicator: %w", err)
	}
	return nil
}

// pick reports whether a PUBLISH on topic is to be duplicated, and after
// what delay.
func (d *Duplicator) pick(topic string) (bool, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cfg.Probability <= 0 {
		return false, 0
	}
	if len(d.cfg.Topics) > 0 {
		ok := false
		for _, f := range d.cfg.Topics {
			if topicMatch(f, topic) {
				ok = true
				break
			}
		}
		if !ok {
			return false, 0
		}
	}
	return d.rng.Float64() < d.cfg.Probability, d.cfg.Delay
}

// dupHook is the mochi hook of one server.
type dupHook struct {
	mqtt.HookBase
	d    *Duplicator
	srv  *mqtt.Server
	cl   *mqtt.Client // an inline client: its publishes skip ACLs and PUBACKs
	stop chan struct{}

	mu      sync.Mutex // guards stopped and wg.Add against Stop
	stopped bool
	wg      sync.WaitGroup
}

func (h *dupHook) ID() string { return "edgefence-duplicator" }

func (h *dupHook) Provides(b byte) bool { return b == mqtt.OnPublished }

// Stop is called by the server's Close: pending duplicates are dropped.
func (h *dupHook) Stop() error {
	h.mu.Lock()
	if !h.stopped {
		h.stopped = true
		close(h.stop)
	}
	h.mu.Unlock()
	h.wg.Wait()
	return nil
}

// OnPublished runs after the original was handed to its subscribers.
func (h *dupHook) OnPublished(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline || pk.FixedHeader.Qos == 0 {
		return
	}
	ok, delay := h.d.pick(pk.TopicName)
	if !ok {
		return
	}
	dup := pk.Copy(false)
	dup.FixedHeader.Retain = false // do not touch the retained store
	dup.FixedHeader.Dup = false
	dup.PacketID = 1 // required for QoS > 0; subscribers get their own ids
	dup.Properties.TopicAlias, dup.Properties.TopicAliasFlag = 0, false
	if delay <= 0 {
		h.inject(dup)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			h.inject(dup)
		case <-h.stop:
		}
	}()
}

func (h *dupHook) inject(pk packets.Packet) {
	// Counted before delivery, so a subscriber that got it sees the count.
	h.d.n.Add(1)
	if err := h.srv.InjectPacket(h.cl, pk); err != nil {
		h.d.n.Add(-1)
	}
}

// topicMatch reports whether topic matches the MQTT filter.
func topicMatch(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false // [MQTT-4.7.2-1]
	}
	fs, ts := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, f := range fs {
		if f == "#" {
			return true
		}
		if i >= len(ts) || (f != "+" && f != ts[i]) {
			return false
		}
	}
	return len(fs) == len(ts)
}
