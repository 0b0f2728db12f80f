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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgefence/edgefence/agent/bridge"
)

// Metrics are read from the agent at scrape time: the collector below turns
// one Status snapshot (plus the outbox summary) into Prometheus samples, so
// the agent keeps a single set of counters and `edgefence status` and
// /metrics always agree. The series are listed in docs/ARCHITECTURE.md,
// "Metrics". Fleet-level series are always there; the series with a device
// label only with metrics.per_device (MetricsConfig.PerDevice).

// MetricsRegistry returns a new registry (not the global default) holding
// the agent's collector, the Go runtime collector and the process collector.
// version is reported by edgefence_build_info.
func (a *Agent) MetricsRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		newAgentCollector(a, version),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// MetricsHandler serves, on a fresh registry (see MetricsRegistry):
//
//   - /metrics: the Prometheus text exposition;
//   - /healthz: 200 "ok" while the process serves HTTP at all;
//   - /readyz: 200 "ready" when the etcd session is up and the transport is
//     connected, else 503 with a one-line reason. A Sender that does not
//     report its state (no Status() map with a "connected" key, e.g. the
//     in-process senders of tests) counts as connected: readiness is then
//     the etcd session alone.
func (a *Agent) MetricsHandler(version string) http.Handler {
	reg := a.MetricsRegistry(version)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
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
	return mux
}

// notReady returns why the agent is not ready, or "" if it is.
func (a *Agent) notReady() string {
	a.mu.Lock()
	up := a.sessionUp
	a.mu.Unlock()
	if !up {
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
var deviceStates = [...]string{StateCampaigning, StateHolding, StateLost, StateRefused, StateAutonomous}

// agentCollector is a prometheus.Collector over Agent.Status.
type agentCollector struct {
	a                 *Agent
	version, revision string
	perDevice         bool // metrics.per_device: the series with a device label

	buildInfo, leasesHeld, devicesConfigured, devicesInState                *prometheus.Desc
	deviceToken, deviceState, deviceCommands, outboxDevicePending           *prometheus.Desc
	outboxDeviceOldestAge, twinDelta, twinUnconverged                       *prometheus.Desc
	acquisitions, losses, regressions, reattached, released                 *prometheus.Desc
	commands, sent, noAck, sendErrors, queued, resent, reissued, superseded *prometheus.Desc
	outboxPendingTotal, outboxPendingBytes, outboxOldestAge                 *prometheus.Desc
	outboxFull, outboxErrors, stateMalformed                                *prometheus.Desc
	etcdUp, etcdSessions, mqttConnected, mqttReconnects                     *prometheus.Desc
	tableCommands, bridgeErrors                                             *prometheus.Desc
	twinEvents, twinSent, twinWritten, twinFenced, twinRefused              *prometheus.Desc
	twinQueued, twinErrors, twinReports, twinWatching                       *prometheus.Desc
	apiRefused                                                              *prometheus.Desc
}

func newAgentCollector(a *Agent, version string) *agentCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("edgefence_"+name, help, labels, nil)
	}
	return &agentCollector{a: a, version: version, revision: vcsRevision(), perDevice: a.cfg.Metrics.PerDevice,
		buildInfo:         d("build_info", "Always 1; the labels give the agent's version, VCS revision, Go version and gateway id.", "version", "revision", "goversion", "gateway"),
		leasesHeld:        d("leases_held", "Devices whose lock this agent holds now."),
		devicesConfigured: d("devices_configured", "Devices in this agent's configuration (leases it campaigns for)."),
		devicesInState:    d("devices", "Devices in each lease state (sums to edgefence_devices_configured).", "state"),
		deviceCommands:    d("device_commands_total", "Commands of the device that ended, by verdict (as edgefence_commands_total, per device).", "device", "verdict"),
		deviceToken:       d("device_token", "The fencing token the agent issues commands under (present while holding, or autonomous).", "device"),
		deviceState:       d("device_state", "1 for the device's current lease state, 0 for the others.", "device", "state"),

		acquisitions: d("lease_acquisitions_total", "Device locks acquired."),
		losses:       d("lease_losses_total", "Device locks lost (session ended or lock key gone)."),
		regressions:  d("token_regressions_total", "Tokens from etcd not above one this gateway held or a fence point of the device holds (refused)."),
		reattached:   d("etcd_sessions_reattached_total", "Sessions resumed because their lease survived (a lost session, or the previous run's after a restart)."),
		released:     d("lock_releases_total", "Device locks let go after a fence point or the regression guard refused the token; each is campaigned for again after a backoff."),

		commands:   d("commands_total", "Commands that ended, by verdict (accepted, duplicate, stale, invalid from device acks; expired from the outbox).", "verdict"),
		sent:       d("commands_sent_total", "Command sends (first sends and resends)."),
		noAck:      d("commands_no_ack_total", "Sends that got no ack in time."),
		sendErrors: d("command_send_errors_total", "Sends the transport failed."),
		queued:     d("commands_queued_total", "Commands appended to the outbox."),
		resent:     d("commands_resent_total", "Commands sent again after no ack or a restart."),
		reissued:   d("commands_reissued_total", "Queued commands re-issued under a newer token (reissue_kinds)."),
		superseded: d("commands_superseded_total", "Queued commands of strict devices ended stale, never sent, once another session held the lock."),

		outboxDevicePending:   d("outbox_device_pending_commands", "Commands of the device pending in the outbox.", "device"),
		outboxPendingTotal:    d("outbox_pending_commands", "Commands pending in the outbox in all."),
		outboxPendingBytes:    d("outbox_pending_bytes", "Envelope bytes pending in the outbox in all."),
		outboxOldestAge:       d("outbox_oldest_pending_age_seconds", "Age of the oldest pending command (0 if none)."),
		outboxDeviceOldestAge: d("outbox_device_oldest_pending_age_seconds", "Age of the oldest pending command of the device, the head of its queue (only devices with pending commands).", "device"),
		outboxFull:            d("outbox_full_total", "Commands refused because an outbox limit was reached."),
		outboxErrors:          d("outbox_errors_total", "Outbox reads or writes that failed."),
		stateMalformed:        d("state_reports_malformed_total", "Device state reports (MQTT state topic) that did not decode and were dropped."),

		etcdUp:         d("etcd_session_up", "1 while the agent's etcd session is open."),
		etcdSessions:   d("etcd_sessions_total", "etcd sessions opened since start."),
		mqttConnected:  d("mqtt_connected", "1 while the MQTT transport is connected."),
		mqttReconnects: d("mqtt_reconnects_total", "MQTT connections established after the first."),

		tableCommands: d("fence_table_commands_total", "Commands the gateway fence table decided, by verdict (accepted = admitted; duplicate, stale, invalid, busy = refused).", "verdict"),
		bridgeErrors:  d("bridge_errors_total", "Gateway fence bridge failures, by kind (table, serial, device, ack).", "kind"),

		twinEvents:   d("twin_desired_events_total", "Desired-state changes seen by the twin watch."),
		twinSent:     d("twin_set_sent_total", "twin.set commands issued."),
		twinWritten:  d("twin_reported_written_total", "Fenced reported-state writes etcd accepted."),
		twinFenced:   d("twin_reported_fenced_total", "Reported-state writes etcd refused because the lock was lost (I5)."),
		twinRefused:  d("twin_set_refused_total", "twin.set commands the device refused as invalid."),
		twinQueued:   d("twin_reported_queued_total", "Reported patches queued in the local cache (etcd out of reach)."),
		twinErrors:   d("twin_errors_total", "Other twin reconciler failures (retried)."),
		twinReports:  d("twin_device_reports_total", "Device state reports written to reported."),
		twinWatching: d("twin_watching", "1 while the twin reconciler watches desired states."),
		twinDelta:    d("twin_delta_fields", "Leaf fields of desired not yet in reported (the twin delta) at the reconciler's last look, per device the agent holds; 0 = converged.", "device"),

		twinUnconverged: d("twin_devices_unconverged", "Devices the agent holds whose twin delta was above 0 at the reconciler's last look."),

		apiRefused: d("api_requests_refused_total", "Local API requests refused as bad input, by reason (too_large, malformed, bad_body, unknown_device).", "reason"),
	}
}

// Describe implements prometheus.Collector.
func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.buildInfo, c.leasesHeld, c.devicesConfigured, c.devicesInState, c.deviceToken, c.deviceState,
		c.deviceCommands, c.outboxDevicePending, c.outboxDeviceOldestAge, c.twinDelta, c.twinUnconverged,
		c.acquisitions, c.losses, c.regressions, c.reattached, c.released,
		c.commands, c.sent, c.noAck, c.sendErrors, c.queued, c.resent, c.reissued, c.superseded,
		c.outboxPendingTotal, c.outboxPendingBytes, c.outboxOldestAge, c.outboxFull, c.outboxErrors,
		c.etcdUp, c.etcdSessions, c.mqttConnected, c.mqttReconnects, c.tableCommands, c.bridgeErrors,
		c.twinEvents, c.twinSent, c.twinWritten, c.twinFenced, c.twinRefused, c.twinQueued, c.twinErrors, c.twinReports, c.twinWatching,
		c.stateMalformed} {
		ch <- d
	}
	ch <- c.apiRefused
	c.a.tails.describe(ch)
}

// Collect implements prometheus.Collector: one Status snapshot per scrape.
func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.a.Status()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	gauge(c.buildInfo, 1, c.version, c.revision, runtime.Version(), s.Gateway)

	var inState [len(deviceStates)]int
	unconverged := 0
	for _, d := range s.Devices {
		if i := slices.Index(deviceStates[:], d.State); i >= 0 {
			inState[i]++
		}
		if d.TwinDelta != nil && *d.TwinDelta > 0 {
			unconverged++
		}
	}
	for i, st := range deviceStates {
		gauge(c.devicesInState, float64(inState[i]), st)
	}
	gauge(c.leasesHeld, float64(inState[slices.Index(deviceStates[:], StateHolding)]))
	gauge(c.devicesConfigured, float64(len(s.Devices)))
	if c.perDevice {
		c.collectDevices(ch, s)
	}

	n := s.Counters
	counter(c.acquisitions, n.Acquired)
	counter(c.losses, n.Lost)
	counter(c.regressions, n.Regressions)
	counter(c.reattached, n.Reattached)
	counter(c.released, n.Released)
	counter(c.commands, n.Accepted, "accepted")
	counter(c.commands, n.Duplicate, "duplicate")
	counter(c.commands, n.Stale, "stale")
	counter(c.commands, n.Invalid, "invalid")
	counter(c.commands, n.Expired, "expired")
	counter(c.sent, n.Sent)
	counter(c.noAck, n.NoAck)
	counter(c.sendErrors, n.SendErrors)
	counter(c.queued, n.Queued)
	counter(c.resent, n.Resent)
	counter(c.reissued, n.Reissued)
	counter(c.superseded, n.Superseded)
	counter(c.outboxFull, n.Full)
	counter(c.outboxErrors, n.OutboxErr)
	for i, why := range apiRefusals {
		counter(c.apiRefused, c.a.stats.apiRefused[i].Load(), why)
	}
	c.a.tails.collect(ch, s.LeaseTail)

	if ob := c.a.outbox; ob != nil {
		if sum, err := ob.Summary(""); err == nil {
			// Only devices with pending commands (Summary's list): an
			// empty queue has no age, and 10,000 idle devices cost no
			// series.
			for _, ds := range sum.Devices {
				if c.perDevice && ds.Pending > 0 {
					gauge(c.outboxDeviceOldestAge, max(ds.OldestAge, 0).Seconds(), ds.Device)
				}
			}
			gauge(c.outboxPendingTotal, float64(sum.Pending))
			gauge(c.outboxPendingBytes, float64(sum.Bytes))
			gauge(c.outboxOldestAge, max(sum.OldestAge, 0).Seconds())
		} else {
			ch <- prometheus.NewInvalidMetric(c.outboxPendingTotal, fmt.Errorf("outbox summary: %w", err))
		}
	}

	gauge(c.etcdUp, b2f(s.Etcd.Session))
	counter(c.etcdSessions, s.Etcd.Sessions)
	if v, ok := s.Transport["connected"].(bool); ok {
		gauge(c.mqttConnected, b2f(v))
	}
	if v, ok := s.Transport["reconnects"].(uint64); ok {
		counter(c.mqttReconnects, v)
	}

	if b, ok := s.Bridge.(bridge.Stats); ok {
		counter(c.tableCommands, b.Accepted, "accepted")
		counter(c.tableCommands, b.Duplicate, "duplicate")
		counter(c.tableCommands, b.Stale, "stale")
		counter(c.tableCommands, b.Invalid, "invalid")
		counter(c.tableCommands, b.Busy, "busy")
		counter(c.bridgeErrors, b.TableErrors, "table")
		counter(c.bridgeErrors, b.SerialErrors, "serial")
		counter(c.bridgeErrors, b.DeviceErrors, "device")
		counter(c.bridgeErrors, b.AckErrors, "ack")
	}

	if t := s.Twins; t != nil {
		counter(c.twinEvents, t.Events)
		counter(c.twinSent, t.Sent)
		counter(c.twinWritten, t.Written)
		counter(c.twinFenced, t.Fenced)
		counter(c.twinRefused, t.Refused)
		counter(c.twinQueued, t.Queued)
		counter(c.twinErrors, t.Errors)
		counter(c.twinReports, t.Reports)
		gauge(c.twinWatching, b2f(t.Watching))
		gauge(c.twinUnconverged, float64(unconverged))
		counter(c.stateMalformed, n.StateMalformed) // state reports are read only with twins on
	}
}

// collectDevices sends the series with a device label (metrics.per_device):
// 11 to 14 per device, so off by default.
func (c *agentCollector) collectDevices(ch chan<- prometheus.Metric, s Status) {
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	for _, d := range s.Devices {
		if (d.State == StateHolding || d.State == StateAutonomous) && d.Token != 0 {
			metric(c.deviceToken, prometheus.GaugeValue, float64(d.Token), d.ID)
		}
		for _, st := range deviceStates {
			metric(c.deviceState, prometheus.GaugeValue, b2f(d.State == st), d.ID, st)
		}
		v := d.Verdicts
		for i, n := range [len(verdictNames)]uint64{v.Accepted, v.Duplicate, v.Stale, v.Invalid, v.Expired} {
			metric(c.deviceCommands, prometheus.CounterValue, float64(n), d.ID, verdictNames[i])
		}
		if d.TwinDelta != nil {
			metric(c.twinDelta, prometheus.GaugeValue, float64(*d.TwinDelta), d.ID)
		}
		if c.a.outbox != nil {
			metric(c.outboxDevicePending, prometheus.GaugeValue, float64(d.Queued), d.ID)
		}
	}
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
