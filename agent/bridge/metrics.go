package bridge

import "github.com/edgefence/edgefence/internal/promtext"

// Collector returns a promtext.Collector over the bridge's counters
// (Stats): edgefence_fence_table_commands_total{verdict} and
// edgefence_bridge_errors_total{kind}. The daemon registers it beside the
// agent's collector.
func (b *Bridge) Collector() promtext.Collector { return collector{b} }

var (
	tableCommandsDesc = promtext.NewDesc("edgefence_fence_table_commands_total",
		"Commands the gateway fence table decided, by verdict (accepted = admitted; duplicate, stale, invalid, busy = refused; unknown = admitted, sent, never answered, not repeated).", promtext.TypeCounter, "verdict")
	bridgeErrorsDesc = promtext.NewDesc("edgefence_bridge_errors_total",
		"Gateway fence bridge failures, by kind (table, serial, device, ack).", promtext.TypeCounter, "kind")
	unauthDesc = promtext.NewDesc("edgefence_fence_table_unauthenticated_total",
		"Commands the gateway fence refused as not signed by a key allowed for the device (also counted as invalid).", promtext.TypeCounter)
	trustDesc = promtext.NewDesc("edgefence_fence_table_trust_statements_total",
		"Statements of trust updates the gateway fence took in (applied), already held (held) or refused (refused: older than held, or not the operator root's).", promtext.TypeCounter, "outcome")
	resetsDesc = promtext.NewDesc("edgefence_fence_table_resets_total",
		"Operator fence resets at the gateway fence table, by result (applied; refused: forged, replayed, another device's, no root — also counted as invalid).", promtext.TypeCounter, "result")
	unsignedDesc = promtext.NewDesc("edgefence_fence_table_unsigned_total",
		"Plain (unsigned) envelopes the gateway fence took for its auth: off devices.", promtext.TypeCounter)

	// Per Modbus bus (modbus.go, poll.go).
	busTxDesc = promtext.NewDesc("edgefence_modbus_transactions_total",
		"Modbus transactions on the bus, by outcome (ok: answered; exception; timeout: no answer; crc: a corrupt answer; frame: an answer from another unit or function, or malformed; not_sent: the port or connection was down).", promtext.TypeCounter, "bus", "outcome")
	busBusyDesc = promtext.NewDesc("edgefence_modbus_busy_seconds_total",
		"Time the bus was in use by transactions, silences included: rate() is the bus's utilisation.", promtext.TypeCounter, "bus")
	busPollsDesc = promtext.NewDesc("edgefence_modbus_polls_total",
		"Polls of reported fields on the bus.", promtext.TypeCounter, "bus")
	busPollBusyDesc = promtext.NewDesc("edgefence_modbus_poll_busy_seconds_total",
		"Time polls took on the bus: rate() is the polls' utilisation, capped by poll_utilisation.", promtext.TypeCounter, "bus")
	busPollCapDesc = promtext.NewDesc("edgefence_modbus_poll_utilisation_cap",
		"The bus's poll_utilisation: the share of its time polls may take.", promtext.TypeGauge, "bus")
	unitPollErrDesc = promtext.NewDesc("edgefence_modbus_device_poll_errors_total",
		"Polls of a Modbus device that failed (no answer, exception, undecodable).", promtext.TypeCounter, "device")
)

type collector struct{ b *Bridge }

func (c collector) Collect(w *promtext.Writer) {
	s := c.b.Stats()
	for _, v := range []struct {
		d     *promtext.Desc
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
		w.Sample(v.d, float64(v.n), v.label)
	}
	w.Sample(unauthDesc, float64(s.Unauthenticated))
	w.Sample(unsignedDesc, float64(s.Unsigned))
	c.collectBuses(w)
}

func (c collector) collectBuses(w *promtext.Writer) {
	counter := w.Sample
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
		w.Sample(busPollCapDesc, s.PollCap, s.Name)
	}
	for _, u := range c.b.Units() {
		counter(unitPollErrDesc, float64(u.PollErrs), u.Device)
	}
}
