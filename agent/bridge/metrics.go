package bridge

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a prometheus.Collector over the bridge's counters
// (Stats): edgefence_fence_table_commands_total{verdict} and
// edgefence_bridge_errors_total{kind}. The daemon registers it beside the
// agent's collector.
func (b *Bridge) Collector() prometheus.Collector { return collector{b} }

var (
	tableCommandsDesc = prometheus.NewDesc("edgefence_fence_table_commands_total",
		"Commands the gateway fence table decided, by verdict (accepted = admitted; duplicate, stale, invalid, busy = refused; unknown = admitted, sent, never answered, not repeated).", []string{"verdict"}, nil)
	bridgeErrorsDesc = prometheus.NewDesc("edgefence_bridge_errors_total",
		"Gateway fence bridge failures, by kind (table, serial, device, ack).", []string{"kind"}, nil)
	unauthDesc = prometheus.NewDesc("edgefence_fence_table_unauthenticated_total",
		"Commands the gateway fence refused as not signed by a key allowed for the device (also counted as invalid).", nil, nil)
	trustDesc = prometheus.NewDesc("edgefence_fence_table_trust_statements_total",
		"Statements of trust updates the gateway fence took in (applied), already held (held) or refused (refused: older than held, or not the operator root's).", []string{"outcome"}, nil)
	resetsDesc = prometheus.NewDesc("edgefence_fence_table_resets_total",
		"Operator fence resets at the gateway fence table, by result (applied; refused: forged, replayed, another device's, no root — also counted as invalid).", []string{"result"}, nil)
	unsignedDesc = prometheus.NewDesc("edgefence_fence_table_unsigned_total",
		"Plain (unsigned) envelopes the gateway fence took for its auth: off devices.", nil, nil)

	// Per Modbus bus (modbus.go, poll.go).
	busTxDesc = prometheus.NewDesc("edgefence_modbus_transactions_total",
		"Modbus transactions on the bus, by outcome (ok: answered; exception; timeout: no answer; crc: a corrupt answer; frame: an answer from another unit or function, or malformed; not_sent: the port or connection was down).",
		[]string{"bus", "outcome"}, nil)
	busBusyDesc = prometheus.NewDesc("edgefence_modbus_busy_seconds_total",
		"Time the bus was in use by transactions, silences included: rate() is the bus's utilisation.", []string{"bus"}, nil)
	busPollsDesc = prometheus.NewDesc("edgefence_modbus_polls_total",
		"Polls of reported fields on the bus.", []string{"bus"}, nil)
	busPollBusyDesc = prometheus.NewDesc("edgefence_modbus_poll_busy_seconds_total",
		"Time polls took on the bus: rate() is the polls' utilisation, capped by poll_utilisation.", []string{"bus"}, nil)
	busPollCapDesc = prometheus.NewDesc("edgefence_modbus_poll_utilisation_cap",
		"The bus's poll_utilisation: the share of its time polls may take.", []string{"bus"}, nil)
	unitPollErrDesc = prometheus.NewDesc("edgefence_modbus_device_poll_errors_total",
		"Polls of a Modbus device that failed (no answer, exception, undecodable).", []string{"device"}, nil)
)

type collector struct{ b *Bridge }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tableCommandsDesc
	ch <- bridgeErrorsDesc
	ch <- unauthDesc
	ch <- trustDesc
	ch <- resetsDesc
	ch <- unsignedDesc
	for _, d := range []*prometheus.Desc{busTxDesc, busBusyDesc, busPollsDesc, busPollBusyDesc, busPollCapDesc, unitPollErrDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.b.Stats()
	for _, v := range []struct {
		d     *prometheus.Desc
		n     uint64
		label string
	}{
		{tableCommandsDesc, s.Accepted, "accepted"},
		{tableCommandsDesc, s.Duplicate, "duplicate"},
		{tableCommandsDesc, s.Stale, "stale"},
		{tableCommandsDesc, s.Invalid, "invalid"},
		{tableCommandsDesc, s.Busy, "busy"},
		{tableCommandsDesc, s.Unknown, "unknown"},
		{bridgeErrorsDesc, s.TableErrors, "table"},
		{bridgeErrorsDesc, s.SerialErrors, "serial"},
		{bridgeErrorsDesc, s.DeviceErrors, "device"},
		{bridgeErrorsDesc, s.AckErrors, "ack"},
		{trustDesc, s.TrustApplied, "applied"},
		{trustDesc, s.TrustHeld, "held"},
		{trustDesc, s.TrustRefused, "refused"},
		{resetsDesc, s.Resets, "applied"},
		{resetsDesc, s.ResetsRefused, "refused"},
	} {
		ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), v.label)
	}
	ch <- prometheus.MustNewConstMetric(unauthDesc, prometheus.CounterValue, float64(s.Unauthenticated))
	ch <- prometheus.MustNewConstMetric(unsignedDesc, prometheus.CounterValue, float64(s.Unsigned))
	c.collectBuses(ch)
}

func (c collector) collectBuses(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for _, s := range c.b.Buses() {
		t := s.Stats
		for _, o := range []struct {
			n     uint64
			label string
		}{{t.Transactions - t.Exceptions - t.Timeouts, "ok"}, {t.Exceptions, "exception"}, {t.Timeouts, "timeout"}, {t.CRCErrors, "crc"},
			{t.FrameErrors, "frame"}, {t.NotSent, "not_sent"}} {
			counter(busTxDesc, float64(o.n), s.Name, o.label)
		}
		counter(busBusyDesc, t.Busy.Seconds(), s.Name)
		counter(busPollsDesc, float64(s.Polls), s.Name)
		counter(busPollBusyDesc, s.PollBusy.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(busPollCapDesc, prometheus.GaugeValue, s.PollCap, s.Name)
	}
	for _, u := range c.b.Units() {
		counter(unitPollErrDesc, float64(u.PollErrs), u.Device)
	}
}
