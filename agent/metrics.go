package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/internal/promtext"
	"github.com/edgefence/edgefence/offline"
)

// Metrics are read from the agent at scrapeView time: the collector below turns
// one Status snapshot (plus the outbox summary) into Prometheus samples, so
// the agent keeps a single set of counters and `edgefence status` and
// /metrics always agree. The series are listed in docs/ARCHITECTURE.md,
// "Metrics". Fleet-level series are always there; the series with a device
// label only with metrics.per_device (MetricsConfig.PerDevice).

// MetricsCollectors returns the collectors /metrics serves: the agent's
// (version is reported by edgefence_build_info), the Go runtime's, the
// process's and extra (e.g. the gateway fence bridge's, bridge.Collector).
func (a *Agent) MetricsCollectors(version string, extra ...promtext.Collector) []promtext.Collector {
	return append([]promtext.Collector{newAgentCollector(a, version), promtext.GoCollector(), promtext.ProcessCollector()}, extra...)
}

// MetricsHandler serves:
//
//   - /metrics: the Prometheus text exposition of MetricsCollectors (a
//     series that cannot be read, e.g. the outbox's pending count on a
//     failing disk, is left out and the scrape logged at Warn);
//   - /healthz: 200 "ok" while the process serves HTTP at all;
//   - /readyz: 200 "ready" when the etcd session is up and the transport is
//     connected, else 503 with a one-line reason. A Sender that does not
//     report its state (no Status() map with a "connected" key, e.g. the
//     in-process senders of tests) counts as connected: readiness is then
//     the etcd session alone;
//   - /debug/pprof/: Go's profiler, only with metrics.pprof.
func (a *Agent) MetricsHandler(version string, extra ...promtext.Collector) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promtext.Handler(func(err error) {
		a.log.Warn("metrics: series left out of the scrape", "err", err)
	}, a.MetricsCollectors(version, extra...)...))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if reason := a.notReady(); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, reason)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if a.cfg.Metrics.Pprof {
		servePprof(mux)
	}
	return mux
}

// notReady returns why the agent is not ready, or "" if it is.
func (a *Agent) notReady() string {
	if up, _, _ := a.leases.session(); !up {
		return "etcd session down"
	}
	if ts, ok := a.sender.(transportStatus); ok {
		if c, ok := ts.Status()["connected"].(bool); ok && !c {
			return "transport not connected"
		}
	}
	return ""
}

// ServeMetrics serves h on addr (host:port) until ctx ends, then shuts the
// server down (waiting up to 5s for scrapes in flight). It returns nil after
// a shutdown caused by ctx, and an error if addr cannot be listened on.
func ServeMetrics(ctx context.Context, addr string, h http.Handler) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- srv.Shutdown(sctx)
		case <-stop: // Serve failed on its own
			done <- nil
		}
	}()
	err = srv.Serve(ln)
	close(stop)
	shutErr := <-done
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: %w", err)
	}
	if shutErr != nil {
		return fmt.Errorf("metrics: shutdown: %w", shutErr)
	}
	return nil
}

// deviceStates are the states edgefence_device_state reports, one series
// each per device.
var deviceStates = [...]string{StateCampaigning, StateHolding, StateLost, StateRefused, StateAutonomous, StateUntrusted}

// series is one metric family the agent exports. The list below is the
// only place a series is named: Collect walks it, so a new
// counter is one entry (plus its field in Counters).
type series struct {
	name, help string
	typ        promtext.Type
	labels     []string
	perDevice  bool // has a device label: only with metrics.per_device
	collect    func(v *scrapeView, emit func(float64, ...string))
}

// scrapeView is what one Collect reads: one Status snapshot and one outbox
// summary, so that every series of a scrapeView agrees.
type scrapeView struct {
	s           Status
	n           Counters
	sum         offline.Summary
	sumErr      error
	inState     [len(deviceStates)]int
	unconverged int
	authOff     int // devices with auth: off
	apiRefused  [len(apiRefusals)]uint64
	fanReq      uint64
	fanDevs     [len(fanoutOutcomes)]uint64
	jobs        jobs.RunnerStats // zero while the runner is off
	ended       int64            // ended commands the outbox keeps
}

func gauge(name, help string, f func(*scrapeView) float64) series {
	return series{name: name, help: help, typ: promtext.TypeGauge,
		collect: func(v *scrapeView, emit func(float64, ...string)) { emit(f(v)) }}
}

func counter(name, help string, f func(*Counters) uint64) series {
	return series{name: name, help: help, typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) { emit(float64(f(&v.n))) }}
}

// twinCounter and twinGauge are there only while the reconciler runs.
func twinCounter(name, help string, f func(*scrapeView) uint64) series {
	return series{name: name, help: help, typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if v.s.Twins != nil {
				emit(float64(f(v)))
			}
		}}
}

func twinGauge(name, help string, f func(*scrapeView) float64) series {
	return series{name: name, help: help, typ: promtext.TypeGauge,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if v.s.Twins != nil {
				emit(f(v))
			}
		}}
}

// deviceAuthCounter is a counter by reason of the ack and state report
// checks (all 0 while no device requires them).
func deviceAuthCounter(name, help string, f func(*scrapeView) map[string]uint64) series {
	return series{name: name, help: help, typ: promtext.TypeCounter, labels: []string{"reason"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			var m map[string]uint64
			if v.s.DeviceAuth != nil {
				m = f(v)
			}
			for _, why := range deviceAuthRefusals {
				emit(float64(m[why]), why)
			}
		}}
}

// perDevice is a series with a device label (and maybe more labels).
func perDevice(name, help string, typ promtext.Type, labels []string, f func(d *DeviceStatus, emit func(float64, ...string))) series {
	return series{name: name, help: help, typ: typ, labels: append([]string{"device"}, labels...), perDevice: true,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for i := range v.s.Devices {
				d := &v.s.Devices[i]
				f(d, func(x float64, l ...string) { emit(x, append([]string{d.ID}, l...)...) })
			}
		}}
}

// agentSeries is every series of the agent's collector but the lease-tail
// meters (tail.go), in exposition order.
var agentSeries = []series{
	{name: "build_info", help: "Always 1; the labels give the agent's version, VCS revision, Go version and gateway id.",
		typ: promtext.TypeGauge, labels: []string{"version", "revision", "goversion", "gateway"}}, // Collect fills it
	gauge("leases_held", "Devices whose lock this agent holds now.",
		func(v *scrapeView) float64 { return float64(v.inState[slices.Index(deviceStates[:], StateHolding)]) }),
	gauge("devices_configured", "Devices in this agent's configuration (leases it campaigns for).",
		func(v *scrapeView) float64 { return float64(len(v.s.Devices)) }),
	gauge("devices_auth_off", "Devices whose policy is auth: off: commands to them go as plain envelopes, and their fence points take plain ones (warned at start).",
		func(v *scrapeView) float64 { return float64(v.authOff) }),
	{name: "devices", help: "Devices in each lease state (sums to edgefence_devices_configured).", typ: promtext.TypeGauge, labels: []string{"state"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for i, st := range deviceStates {
				emit(float64(v.inState[i]), st)
			}
		}},

	perDevice("device_token", "The fencing token the agent issues commands under (present while holding, or autonomous).", promtext.TypeGauge, nil,
		func(d *DeviceStatus, emit func(float64, ...string)) {
			if (d.State == StateHolding || d.State == StateAutonomous) && d.Token != 0 {
				emit(float64(d.Token))
			}
		}),
	perDevice("device_state", "1 for the device's current lease state, 0 for the others.", promtext.TypeGauge, []string{"state"},
		func(d *DeviceStatus, emit func(float64, ...string)) {
			for _, st := range deviceStates {
				emit(b2f(d.State == st), st)
			}
		}),
	perDevice("device_commands_total", "Commands of the device that ended, by verdict (as edgefence_commands_total, per device).", promtext.TypeCounter, []string{"verdict"},
		func(d *DeviceStatus, emit func(float64, ...string)) {
			v := d.Verdicts
			for i, n := range [len(verdictNames)]uint64{v.Accepted, v.Duplicate, v.Stale, v.Invalid, v.Expired, v.Unknown} {
				emit(float64(n), verdictNames[i])
			}
		}),
	perDevice("outbox_device_pending_commands", "Commands of the device pending in the outbox.", promtext.TypeGauge, nil,
		func(d *DeviceStatus, emit func(float64, ...string)) { emit(float64(d.Queued)) }),
	{name: "outbox_device_oldest_pending_age_seconds", help: "Age of the oldest pending command of the device, the head of its queue (only devices with pending commands).",
		typ: promtext.TypeGauge, labels: []string{"device"}, perDevice: true,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			// Only devices with pending commands (Summary's list): an
			// empty queue has no age, and 10,000 idle devices cost no
			// series.
			for _, ds := range v.sum.Devices {
				if ds.Pending > 0 {
					emit(max(ds.OldestAge, 0).Seconds(), ds.Device)
				}
			}
		}},
	perDevice("twin_delta_fields", "Leaf fields of desired not yet in reported (the twin delta) at the reconciler's last look, per device the agent holds; 0 = converged.", promtext.TypeGauge, nil,
		func(d *DeviceStatus, emit func(float64, ...string)) {
			if d.TwinDelta != nil {
				emit(float64(*d.TwinDelta))
			}
		}),

	counter("lease_acquisitions_total", "Device locks acquired.", func(n *Counters) uint64 { return n.Acquired }),
	counter("lease_losses_total", "Device locks lost (session ended or lock key gone).", func(n *Counters) uint64 { return n.Lost }),
	counter("fence_resets_total", "Acks of operator fence resets seen (edgefence fence reset): the device's mark the regression guard uses is the reset's.", func(n *Counters) uint64 { return n.Resets }),
	counter("token_regressions_total", "Tokens from etcd not above one this gateway held or a fence point of the device holds (refused).", func(n *Counters) uint64 { return n.Regressions }),
	counter("etcd_sessions_reattached_total", "Sessions resumed because their lease survived (a lost session, or the previous run's after a restart).", func(n *Counters) uint64 { return n.Reattached }),
	counter("lock_releases_total", "Device locks let go after a fence point or the regression guard refused the token; each is campaigned for again after a backoff.", func(n *Counters) uint64 { return n.Released }),

	{name: "commands_total", help: "Commands that ended, by verdict (accepted, duplicate, stale, invalid, unknown from fence point acks; expired from the outbox).",
		typ: promtext.TypeCounter, labels: []string{"verdict"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			n := &v.n
			for i, c := range [len(verdictNames)]uint64{n.Accepted, n.Duplicate, n.Stale, n.Invalid, n.Expired, n.Unknown} {
				emit(float64(c), verdictNames[i])
			}
		}},
	counter("commands_sent_total", "Command sends (first sends and resends).", func(n *Counters) uint64 { return n.Sent }),
	{name: "commands_unsigned_total", help: "Command sends as plain envelopes, not signed (no signing key, or an auth: off device).", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if n, ok := v.s.Transport["unsigned"].(uint64); ok {
				emit(float64(n))
			}
		}},
	counter("commands_no_ack_total", "Sends that got no ack in time.", func(n *Counters) uint64 { return n.NoAck }),
	counter("command_send_errors_total", "Sends the transport failed.", func(n *Counters) uint64 { return n.SendErrors }),
	counter("commands_queued_total", "Commands appended to the outbox.", func(n *Counters) uint64 { return n.Queued }),
	counter("commands_resent_total", "Commands sent again after no ack or a restart.", func(n *Counters) uint64 { return n.Resent }),
	counter("commands_resent_after_trust_total", "Commands sent again after their fence point refused them for want of this gateway's trust update (published again first).", func(n *Counters) uint64 { return n.TrustResent }),
	counter("commands_reissued_total", "Queued commands re-issued under a newer token (reissue_kinds).", func(n *Counters) uint64 { return n.Reissued }),
	counter("commands_superseded_total", "Queued commands of strict devices ended stale, never sent, once another session held the lock.", func(n *Counters) uint64 { return n.Superseded }),

	{name: "outbox_pending_commands", help: "Commands pending in the outbox in all.", typ: promtext.TypeGauge}, // Collect fills it (or says why not)
	gauge("outbox_pending_bytes", "Envelope bytes pending in the outbox in all.", func(v *scrapeView) float64 { return float64(v.sum.Bytes) }),
	gauge("outbox_verdicts_waiting", "Commands ended by their verdict whose record waits for the outbox's next commit (outbox.verdict_delay at most).", func(v *scrapeView) float64 { return float64(v.sum.Waiting) }),
	gauge("outbox_oldest_pending_age_seconds", "Age of the oldest pending command (0 if none).", func(v *scrapeView) float64 { return max(v.sum.OldestAge, 0).Seconds() }),
	gauge("outbox_ended_commands", "Ended commands the outbox keeps: for outbox.retention, at most outbox.max_ended (the oldest go first).", func(v *scrapeView) float64 { return float64(v.ended) }),
	counter("outbox_full_total", "Commands refused because an outbox limit was reached.", func(n *Counters) uint64 { return n.Full }),
	counter("outbox_errors_total", "Outbox reads or writes that failed.", func(n *Counters) uint64 { return n.OutboxErr }),

	gauge("etcd_session_up", "1 while the agent's etcd session is open.", func(v *scrapeView) float64 { return b2f(v.s.Etcd.Session) }),
	{name: "etcd_sessions_total", help: "etcd sessions opened since start.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) { emit(float64(v.s.Etcd.Sessions)) }},
	{name: "mqtt_connected", help: "1 while the MQTT transport is connected.", typ: promtext.TypeGauge,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if c, ok := v.s.Transport["connected"].(bool); ok {
				emit(b2f(c))
			}
		}},
	{name: "mqtt_reconnects_total", help: "MQTT connections established after the first.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if n, ok := v.s.Transport["reconnects"].(uint64); ok {
				emit(float64(n))
			}
		}},
	{name: "mqtt_packets_oversize_total", help: "MQTT packets over mqtt.max_packet_size the broker sent anyway, dropped unread.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if n, ok := v.s.Transport["packets_oversize"].(uint64); ok {
				emit(float64(n))
			}
		}},

	twinCounter("twin_desired_events_total", "Desired-state changes seen by the twin watch.", func(v *scrapeView) uint64 { return v.s.Twins.Events }),
	twinCounter("twin_set_sent_total", "twin.set commands issued.", func(v *scrapeView) uint64 { return v.s.Twins.Sent }),
	twinCounter("twin_reported_written_total", "Fenced reported-state writes etcd accepted.", func(v *scrapeView) uint64 { return v.s.Twins.Written }),
	twinCounter("twin_reported_fenced_total", "Reported-state writes etcd refused because the lock was lost (I5).", func(v *scrapeView) uint64 { return v.s.Twins.Fenced }),
	twinCounter("twin_set_refused_total", "twin.set commands the device refused as invalid.", func(v *scrapeView) uint64 { return v.s.Twins.Refused }),
	twinCounter("twin_reported_queued_total", "Reported patches queued in the local cache (etcd out of reach).", func(v *scrapeView) uint64 { return v.s.Twins.Queued }),
	twinCounter("twin_errors_total", "Other twin reconciler failures (retried).", func(v *scrapeView) uint64 { return v.s.Twins.Errors }),
	twinCounter("twin_device_reports_total", "Device state reports written to reported.", func(v *scrapeView) uint64 { return v.s.Twins.Reports }),
	twinGauge("twin_watching", "1 while the twin reconciler watches desired states.", func(v *scrapeView) float64 { return b2f(v.s.Twins.Watching) }),
	twinGauge("twin_devices_unconverged", "Devices the agent holds whose twin delta was above 0 at the reconciler's last look.", func(v *scrapeView) float64 { return float64(v.unconverged) }),
	// State reports are read only with twins or jobs on.
	{name: "state_reports_malformed_total", help: "Device state reports (MQTT state topic) that did not decode and were dropped.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if v.s.Twins != nil || v.s.Jobs != nil {
				emit(float64(v.n.StateMalformed))
			}
		}},
	{name: "state_reports_unread_total", help: "Signed device state reports nothing reads (twins off, no firmware field), dropped without checking their signature.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if v.s.Twins != nil || v.s.Jobs != nil {
				emit(float64(v.n.StateUnread))
			}
		}},

	{name: "jobs_executions_ended_total", help: "Firmware job executions this gateway ended, by status (0s while the runner is off).",
		typ: promtext.TypeCounter, labels: []string{"status"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for _, st := range jobs.Statuses {
				if st.Terminal() {
					emit(float64(v.jobs.Ended[st]), string(st))
				}
			}
		}},
	{name: "jobs_steps_total", help: "Firmware steps (fw.begin, fw.chunk, …) sent, by kind and the device's verdict (none: no ack came back).",
		typ: promtext.TypeCounter, labels: []string{"kind", "verdict"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for _, k := range fwjob.Kinds {
				for _, vn := range append(verdictNames[:], "none") {
					emit(float64(v.jobs.Steps[k][vn]), k, vn)
				}
			}
		}},
	{name: "jobs_image_bytes_sent_total", help: "Image bytes of the fw.chunk commands the devices accepted.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) { emit(float64(v.jobs.ImageBytes)) }},
	gauge("jobs_executions_in_progress", "Firmware job executions this gateway drives now.",
		func(v *scrapeView) float64 { return float64(v.jobs.InProgress) }),

	deviceAuthCounter("acks_unauthenticated_total", "Acks of auth: required devices dropped before they could resolve a command (unsigned, forged, not bound to the command …), by reason.",
		func(v *scrapeView) map[string]uint64 { return v.s.DeviceAuth.AcksRefused }),
	deviceAuthCounter("state_reports_unauthenticated_total", "State reports of auth: required devices dropped before the twin (unsigned, forged, replayed …), by reason.",
		func(v *scrapeView) map[string]uint64 { return v.s.DeviceAuth.StatesRefused }),

	{name: "trust_releases_total", help: "auth: required devices this gateway left because it cannot command them with trust (own_certificate: revoked, expired or not naming the device; signer_refused: the device refuses its signer; acks_unverified: the device's acks do not verify), by reason.",
		typ: promtext.TypeCounter, labels: []string{"reason"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			var m map[string]uint64
			if v.s.Trust != nil {
				m = v.s.Trust.Releases
			}
			for _, r := range untrustReasons {
				emit(float64(m[r]), r)
			}
		}},
	{name: "gateway_certificate_ok", help: "1 while this gateway's own certificate is valid under the newest revocation list (0: revoked, expired or not yet valid: it commands no auth: required device). Only with auth.trust_root and auth.certificate.",
		typ: promtext.TypeGauge,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if t := v.s.Trust; t != nil && t.KeyID != "" {
				emit(map[bool]float64{true: 1}[t.CertificateOK])
			}
		}},
	{name: "gateway_certificate_expiry_timestamp_seconds", help: "When this gateway's own certificate expires (Unix seconds).",
		typ: promtext.TypeGauge,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if t := v.s.Trust; t != nil && t.KeyID != "" {
				emit(float64(t.NotAfter.Unix()))
			}
		}},
	{name: "trust_statements_republished_total", help: "Root-signed statements (certificates, revocation lists) this agent put back into etcd after etcd lost them.",
		typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			if t := v.s.Trust; t != nil {
				emit(float64(t.Republished))
			}
		}},
	{name: "fanout_requests_total", help: "Fan-out requests (POST /v1/fanout) that selected devices and were carried out.", typ: promtext.TypeCounter,
		collect: func(v *scrapeView, emit func(float64, ...string)) { emit(float64(v.fanReq)) }},
	{name: "fanout_devices_total", help: "Devices of fan-out requests, by outcome: a verdict, queued (no verdict yet) or refused (by the agent).",
		typ: promtext.TypeCounter, labels: []string{"outcome"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for i, o := range fanoutOutcomes {
				emit(float64(v.fanDevs[i]), o)
			}
		}},
	{name: "api_requests_refused_total", help: "Local API requests refused as bad input (too_large, malformed, bad_body, unknown_device, bad_selection).",
		typ: promtext.TypeCounter, labels: []string{"reason"},
		collect: func(v *scrapeView, emit func(float64, ...string)) {
			for i, why := range apiRefusals {
				emit(float64(v.apiRefused[i]), why)
			}
		}},
}

// agentCollector is a promtext.Collector over Agent.Status and the
// outbox summary, walking agentSeries.
type agentCollector struct {
	a                 *Agent
	version, revision string
	perDevice         bool             // metrics.per_device: the series with a device label
	descs             []*promtext.Desc // agentSeries[i]'s
}

func newAgentCollector(a *Agent, version string) *agentCollector {
	c := &agentCollector{a: a, version: version, revision: vcsRevision(), perDevice: a.cfg.Metrics.PerDevice}
	for _, s := range agentSeries {
		c.descs = append(c.descs, promtext.NewDesc("edgefence_"+s.name, s.help, s.typ, s.labels...))
	}
	return c
}

// Collect implements promtext.Collector: one Status snapshot per scrapeView.
func (c *agentCollector) Collect(w *promtext.Writer) {
	v := &scrapeView{s: c.a.Status()}
	v.n = v.s.Counters
	for _, d := range v.s.Devices {
		if i := slices.Index(deviceStates[:], d.State); i >= 0 {
			v.inState[i]++
		}
		if d.TwinDelta != nil && *d.TwinDelta > 0 {
			v.unconverged++
		}
		if d.Auth == AuthOff {
			v.authOff++
		}
	}
	v.apiRefused = c.a.api.refusedCounts()
	v.fanReq, v.fanDevs = c.a.fanout.counts()
	if v.s.Jobs != nil {
		v.jobs = *v.s.Jobs
	}
	v.sum, v.sumErr = c.a.outbox.Summary("")
	v.ended = c.a.outbox.Ended()
	for i, s := range agentSeries {
		desc := c.descs[i]
		emit := func(x float64, labels ...string) { w.Sample(desc, x, labels...) }
		switch {
		case s.perDevice && !c.perDevice:
		case s.name == "build_info":
			emit(1, c.version, c.revision, runtime.Version(), v.s.Gateway)
		case s.name == "outbox_pending_commands":
			if v.sumErr != nil {
				w.Fail(desc, fmt.Errorf("outbox summary: %w", v.sumErr))
			} else {
				emit(float64(v.sum.Pending))
			}
		case v.sumErr != nil && strings.HasPrefix(s.name, "outbox_") && s.typ == promtext.TypeGauge:
			// No summary: the pending gauges would read 0.
		default:
			s.collect(v, emit)
		}
	}
	c.a.leases.tails.collect(w, v.s.LeaseTail)
}

// vcsRevision is the VCS revision go build stamped into the binary ("" if
// none: built outside a checkout, or with -buildvcs=false).
func vcsRevision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
