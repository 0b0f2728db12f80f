package history

import (
	"fmt"
	"slices"
	"strings"
)

// Firmware step kinds (devices/fwjob), spelled out here as the verdicts
// are, so that this package depends on the standard library only.
const (
	kindFirmwarePrefix = "fw."
	kindActivate       = "fw.activate"
)

// InvariantActivation names the firmware invariant Check adds for
// histories with firmware steps (devices/fwjob, issue 15): per device,
// at most one fw.activate of a job is accepted — one image activated per
// job per device. A broker's redelivery of the same command decided
// again is the same command id and counts once; an accept discarded as
// uncommitted (a later OpOpened of its source) does not count. That no
// step of a deposed holder is applied is I1 (InvariantOrder): firmware
// steps are accepts like any other and are checked with them.
const InvariantActivation = "FW1"

// FirmwareCounts is what Check counted of firmware steps (kinds fw.*).
type FirmwareCounts struct {
	Accepted  map[string]int // committed accepts of firmware steps, by kind
	Jobs      int            // (device, job) pairs with an accepted firmware step
	Activated int            // (device, job) pairs with an accepted fw.activate
}

// jobKey names one firmware job at one device.
type jobKey struct{ dev, job string }

// firmwareStep counts the committed accept e of a firmware step and, for
// fw.activate, notes its command id for checkActivations.
func (c *checker) firmwareStep(e Event) {
	if !strings.HasPrefix(e.Kind, kindFirmwarePrefix) {
		return
	}
	if c.rep.Firmware.Accepted == nil {
		c.rep.Firmware.Accepted = map[string]int{}
	}
	c.rep.Firmware.Accepted[e.Kind]++
	k := jobKey{e.Device, e.Job}
	if _, ok := c.fwJobs[k]; !ok {
		c.fwJobs[k] = nil
	}
	if e.Kind == kindActivate && !slices.ContainsFunc(c.fwJobs[k], func(a accept) bool { return a.id == e.ID }) {
		c.fwJobs[k] = append(c.fwJobs[k], accept{m: markOf(e), id: e.ID, src: e.Source, t: e.Time})
	}
}

// checkActivations checks InvariantActivation, by device and job.
func (c *checker) checkActivations() {
	keys := make([]jobKey, 0, len(c.fwJobs))
	for k := range c.fwJobs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b jobKey) int { return cmpKey(key{a.dev, a.job}, key{b.dev, b.job}) })
	c.rep.Firmware.Jobs = len(keys)
	for _, k := range keys {
		as := c.fwJobs[k]
		if len(as) > 0 {
			c.rep.Firmware.Activated++
		}
		if len(as) < 2 {
			continue
		}
		ids := make([]string, len(as))
		for i, a := range as {
			ids[i] = fmt.Sprintf("%s (%s by %s)", a.id, a.at(), a.src)
		}
		c.violationOf(InvariantActivation, key{k.dev, as[1].id}, "job %q activated %d times: %s",
			k.job, len(as), strings.Join(ids, ", "))
	}
}
