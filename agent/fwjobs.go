package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/edgefence/edgefence/agent/jobs"
)

// The firmware job runner (agent/jobs), on when Options.Jobs and
// Options.Images are set: it drives the firmware jobs of the devices this
// agent holds through Issue (the outbox, the fenced path; a window of
// fw.chunk commands, jobs.window, issued ahead of the device's acks) and
// writes their
// executions fenced by the device's lock key (I5). The leases' acquired
// hook starts a device's worker; DeviceState hands it the "fw" field of
// every configured device's state report, held or not, so that a gateway
// taking a device over has its last report.

// FieldFirmware is the state report field of a device's firmware job
// (devices/fwjob Status.Report).
const FieldFirmware = "fw"

// jobHost is the runner's view of the agent (jobs.Host).
type jobHost struct{ a *Agent }

// Holding returns dev's lock key and token while the agent holds it.
func (h jobHost) Holding(dev string) (jobs.Holder, bool) {
	key, token, ok := h.a.leases.holder(dev)
	if !ok {
		return jobs.Holder{}, false
	}
	return jobs.Holder{Gateway: h.a.cfg.Gateway, LockKey: key, Token: token}, true
}

// IssueAll is Agent.IssueAll; not holding the lease is jobs.ErrFenced.
func (h jobHost) IssueAll(ctx context.Context, dev, kind string, bodies [][]byte) ([]jobs.Pending, error) {
	ps, err := h.a.IssueAll(ctx, dev, kind, bodies)
	if errors.Is(err, ErrNotHolder) {
		return nil, fmt.Errorf("%w: %w", jobs.ErrFenced, err)
	}
	if err != nil {
		return nil, err
	}
	out := make([]jobs.Pending, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out, nil
}

// newJobs returns the runner of o.Jobs and o.Images (nil if either is
// missing).
func (a *Agent) newJobs(o Options) *jobs.Runner {
	if o.Jobs == nil || o.Images == nil {
		return nil
	}
	return jobs.NewRunner(o.Jobs, o.Images, jobHost{a}, jobs.RunnerConfig{Gateway: a.cfg.Gateway, Devices: a.order,
		Logger: a.log, Now: a.now, Window: a.cfg.Jobs.Window})
}

// JobStats returns the firmware job runner's counters (ok false: it is off).
func (a *Agent) JobStats() (jobs.RunnerStats, bool) {
	if a.jobs == nil {
		return jobs.RunnerStats{}, false
	}
	return a.jobs.Stats(), true
}

// firmwareReport hands the "fw" field of dev's state report to the runner.
func (a *Agent) firmwareReport(dev string, fields map[string]any) {
	if a.jobs == nil {
		return
	}
	fw, ok := fields[FieldFirmware].(map[string]any)
	if !ok {
		return
	}
	a.jobs.Report(dev, fw)
}
