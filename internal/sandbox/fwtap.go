package sandbox

import (
	"strings"
	"sync"
	"time"

	"github.com/fxamacker/cbor/v2"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	emqtt "github.com/edgefence/edgefence/transport/mqtt"
)

// FirmwareReport is the `fw` field of a firmware device's state report
// (fwjob.Status.Report), as a run saw it go by, with the time it did.
type FirmwareReport struct {
	Job    string      `cbor:"job" json:"job,omitempty"`
	State  string      `cbor:"state" json:"state"`
	Bytes  uint64      `cbor:"bytes" json:"bytes"`
	Size   uint64      `cbor:"size" json:"size,omitempty"`
	Slot   string      `cbor:"slot" json:"slot"`
	Token  fence.Token `cbor:"token" json:"token,omitempty"`
	Image  string      `cbor:"image" json:"image,omitempty"`
	Reason string      `cbor:"reason" json:"reason,omitempty"`
	Boots  uint64      `cbor:"boots" json:"boots"`
	At     time.Time   `cbor:"-" json:"at"`
}

// FirmwareStep is one command to the device as the broker passed it on,
// with the device's verdict from its ack ("" while none came; "dropped"
// for a command the run dropped in the broker).
type FirmwareStep struct {
	At      time.Time   `json:"at"`
	Holder  string      `json:"holder"`
	Token   fence.Token `json:"token"`
	Seq     uint64      `json:"seq"`
	Kind    string      `json:"kind"`
	Off     uint64      `json:"off,omitempty"` // fw.chunk's offset
	ID      string      `json:"id"`
	Verdict string      `json:"verdict,omitempty"`
	Reason  string      `json:"reason,omitempty"`
	AckAt   time.Time   `json:"ack_at,omitzero"`
}

// tapEvent is what the tap saw: a command to the device (Step) or its
// state report (Report).
type tapEvent struct {
	Client string
	Step   *FirmwareStep
	Report *FirmwareReport
}

// tapAction is what a trigger does with the packet that fired it.
type tapAction int

const (
	tapPass tapAction = iota // deliver it
	tapDrop                  // drop it (its sender is dead)
	tapHold                  // deliver it once the tap is released
)

// fwTap is a hook in the run's in-process broker that watches one
// device's traffic — the commands to it, its acks and its state reports
// — and, once armed, fires a trigger on the first packet it matches: the
// fault of a firmware run lands at an exact step, not at a random moment.
type fwTap struct {
	mqtt.HookBase
	topics emqtt.Topics
	dev    string

	mu      sync.Mutex
	steps   []*FirmwareStep
	byID    map[string]*FirmwareStep
	reports []FirmwareReport
	trigger func(tapEvent) (tapAction, bool) // fires once: ok
	fired   chan struct{}
	firedAt time.Time      // when the trigger fired
	lastAt  FirmwareReport // the device's last report then
	release chan struct{}  // a held packet waits for it
	relOnce sync.Once
	off     bool
}

func newFWTap(prefix, dev string) *fwTap {
	return &fwTap{topics: emqtt.Topics{Prefix: prefix}, dev: dev, byID: map[string]*FirmwareStep{},
		release: make(chan struct{})}
}

func (t *fwTap) ID() string { return "edgefence-fwtap-" + t.dev }

func (t *fwTap) Provides(b byte) bool { return b == mqtt.OnPublish }

// arm sets the trigger: fn is asked about each packet the tap decodes
// until it says ok. The returned channel is closed when it fired.
func (t *fwTap) arm(fn func(tapEvent) (tapAction, bool)) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trigger, t.fired = fn, make(chan struct{})
	return t.fired
}

// releaseHeld lets a held packet go on.
func (t *fwTap) releaseHeld() { t.relOnce.Do(func() { close(t.release) }) }

// close makes the tap inert (the broker may outlive the run) and releases
// a held packet.
func (t *fwTap) close() {
	t.mu.Lock()
	t.off = true
	t.mu.Unlock()
	t.releaseHeld()
}

// OnPublish records the device's traffic and fires the armed trigger.
func (t *fwTap) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	ev := tapEvent{Client: cl.ID}
	now := time.Now()
	switch pk.TopicName {
	case t.topics.Cmd(t.dev):
		env, err := fence.UnmarshalEnvelope(pk.Payload)
		if err != nil || !strings.HasPrefix(env.Kind, "fw.") {
			return pk, nil
		}
		s := &FirmwareStep{At: now, Holder: env.Holder, Token: env.Token, Seq: env.Seq, Kind: env.Kind, ID: env.ID}
		var body fwjob.ChunkBody
		if env.Kind == fwjob.KindChunk && fence.DecodeBody(env.Body, &body) == nil {
			s.Off = body.Off
		}
		ev.Step = s
	case t.topics.State(t.dev):
		var st struct {
			FW FirmwareReport `cbor:"fw"`
		}
		if cbor.Unmarshal(pk.Payload, &st) != nil {
			return pk, nil
		}
		st.FW.At = now
		ev.Report = &st.FW
	default:
		t.ack(pk.Payload, now)
		return pk, nil
	}
	switch t.record(ev) {
	case tapDrop:
		return pk, packets.ErrRejectPacket
	case tapHold:
		<-t.release
	}
	return pk, nil
}

// record keeps ev and asks the trigger about it.
func (t *fwTap) record(ev tapEvent) tapAction {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off {
		return tapPass
	}
	if s := ev.Step; s != nil {
		t.steps = append(t.steps, s)
		t.byID[s.ID] = s
	} else {
		t.reports = append(t.reports, *ev.Report)
	}
	if t.trigger == nil {
		return tapPass
	}
	act, ok := t.trigger(ev)
	if !ok {
		return tapPass
	}
	t.trigger, t.firedAt = nil, time.Now()
	if n := len(t.reports); n > 0 {
		t.lastAt = t.reports[n-1]
	}
	close(t.fired)
	if act == tapDrop && ev.Step != nil {
		ev.Step.Verdict = "dropped"
	}
	return act
}

// ack notes the verdict of an ack from the device, on whatever topic.
func (t *fwTap) ack(payload []byte, at time.Time) {
	a, err := fence.UnmarshalAck(payload)
	if err != nil || a.Device != t.dev {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.byID[a.ID]; s != nil && s.Verdict == "" {
		s.Verdict, s.Reason, s.AckAt = a.Verdict.String(), a.Reason, at
	}
}

// snapshot returns copies of the steps and reports so far.
func (t *fwTap) snapshot() ([]FirmwareStep, []FirmwareReport) {
	t.mu.Lock()
	defer t.mu.Unlock()
	steps := make([]FirmwareStep, len(t.steps))
	for i, s := range t.steps {
		steps[i] = *s
	}
	return steps, append([]FirmwareReport(nil), t.reports...)
}

// firing returns when the trigger fired and the device's last report
// then.
func (t *fwTap) firing() (time.Time, FirmwareReport) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firedAt, t.lastAt
}

// step returns the step with command id id.
func (t *fwTap) step(id string) (FirmwareStep, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byID[id]
	if !ok {
		return FirmwareStep{}, false
	}
	return *s, true
}

// lastReport returns the latest report (ok false: none yet).
func (t *fwTap) lastReport() (FirmwareReport, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.reports) == 0 {
		return FirmwareReport{}, false
	}
	return t.reports[len(t.reports)-1], true
}
