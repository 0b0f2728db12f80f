package agent

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/shadow"
)

// Device state reports arrive on the MQTT state topic (twins or jobs on). One that
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
	unread    atomic.Uint64 // signed, read by nothing: not verified (unread)
	logs      logLimit      // per device (or unknownDevice)
}

type reportLog struct {
	at         time.Time // when the last line was logged
	suppressed uint64    // reports not logged since
}

// DeviceStateReport decodes a device's state report (the CBOR payload of its
// MQTT state topic) and hands it to DeviceState. A payload that does not
// decode is dropped with a counter and a rate-limited WARN line naming the
// device and the error. An `auth: required` device's report must be signed
// by its key and newer than the last (deviceauth.go): anything else never
// reaches the twin.
func (a *Agent) DeviceStateReport(dev string, payload []byte) {
	if a.devauth.required[dev] && a.unread(payload) {
		a.reports.unread.Add(1)
		return
	}
	changed := a.keep.changes()
	if fields, checked, err := a.devauth.checkState(dev, payload); checked {
		switch {
		case err == nil:
			a.DeviceState(dev, fields)
		case isClosed(changed):
			// The trust learnt a statement while the report was
			// checked: retryReports may have woken before it was kept.
			a.handLater()
		}
		return
	}
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
	r := &a.reports
	suppressed, ok := r.logs.allow(key, a.now())
	if !ok {
		return
	}
	a.log.Warn("device state report malformed; dropped", "device", dev, "err", err, "bytes", len(payload),
		"suppressed", suppressed, "known_device", key == dev)
}

// retryReports hands again the state reports refused for want of their
// device's certificate (deviceAuth.takeLater) each time the trust learns a
// statement — a certificate read ahead, enrolled since, put back —, until
// ctx ends: a device's retained report, which the broker does not send
// again, still reaches the twin and the firmware runner.
func (a *Agent) retryReports(ctx context.Context) {
	for {
		changed := a.keep.changes()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		a.handLater()
	}
}

// handLater hands again the state reports kept for want of their device's
// certificate.
func (a *Agent) handLater() {
	for dev, payload := range a.devauth.takeLater() {
		a.DeviceStateReport(dev, payload)
	}
}

// isClosed reports whether ch is closed (false for nil).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// unread reports whether nothing in the agent would read the signed state
// report payload: twins off and no firmware field (FieldFirmware), which
// is all the job runner reads. Such a report has no effect, so its
// signature is not checked (an ES256 verify for every command a device
// applies). One that does not decode is checked, and refused, as any
// other.
func (a *Agent) unread(payload []byte) bool {
	if a.twin != nil {
		return false
	}
	r, err := auth.UnverifiedState(payload)
	if err != nil {
		return false
	}
	fields, err := shadow.DecodeCBOR(r.State, shadow.Limits{})
	if err != nil {
		return false
	}
	_, fw := fields[FieldFirmware]
	return !fw
}
