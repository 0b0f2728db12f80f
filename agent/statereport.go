package agent

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

// Device state reports arrive on the MQTT state topic (twins on). One that
// does not decode is dropped, counted (state_reports_malformed,
// edgefence_state_reports_malformed_total) and logged at WARN — at most one
// line per device per malformedLogEvery, the next line saying how many were
// left out meanwhile, so that a device publishing garbage in a loop cannot
// flood the journal.

// malformedLogEvery is the least time between two WARN lines about one
// device's malformed state reports.
const malformedLogEvery = 10 * time.Second

// unknownDevice keys the one rate limit shared by reports on the topics of
// devices this agent does not know: their ids come from the topic, so a
// limit each would let anyone grow the map.
const unknownDevice = "\x00unknown"

// stateReports counts and rate-limits malformed device state reports.
type stateReports struct {
	malformed atomic.Uint64

	mu   sync.Mutex
	last map[string]*reportLog // per device (or unknownDevice)
}

type reportLog struct {
	at         time.Time // when the last line was logged
	suppressed uint64    // reports not logged since
}

// DeviceStateReport decodes a device's state report (the CBOR payload of its
// MQTT state topic) and hands it to DeviceState. A payload that does not
// decode is dropped with a counter and a rate-limited WARN line naming the
// device and the error.
func (a *Agent) DeviceStateReport(dev string, payload []byte) {
	fields, err := shadow.DecodeCBOR(payload, shadow.Limits{})
	if err == nil {
		a.DeviceState(dev, fields)
		return
	}
	a.reports.malformed.Add(1)
	key := dev
	if _, ok := a.devices[dev]; !ok {
		key = unknownDevice
	}
	now := a.now()
	r := &a.reports
	r.mu.Lock()
	if r.last == nil {
		r.last = make(map[string]*reportLog)
	}
	l := r.last[key]
	if l == nil {
		l = &reportLog{}
		r.last[key] = l
	} else if now.Sub(l.at) < malformedLogEvery {
		l.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.at, l.suppressed = now, 0
	r.mu.Unlock()
	a.log.Warn("device state report malformed; dropped", "device", dev, "err", err, "bytes", len(payload),
		"suppressed", suppressed, "known_device", key == dev)
}
