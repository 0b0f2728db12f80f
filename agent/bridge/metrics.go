package bridge

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a prometheus.Collector over the bridge's counters
// (Stats): edgefence_fence_table_commands_total{verdict} and
// edgefence_bridge_errors_total{kind}. The daemon registers it beside the
// agent's collector.
func (b *Bridge) Collector() prometheus.Collector { return collector{b} }

var (
	tableCommandsDesc = prometheus.NewDesc("edgefence_fence_table_commands_total",
		"Commands the gateway fence table decided, by verdict (accepted = admitted; duplicate, stale, invalid, busy = refused).", []string{"verdict"}, nil)
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
)

type collector struct{ b *Bridge }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tableCommandsDesc
	ch <- bridgeErrorsDesc
	ch <- unauthDesc
	ch <- trustDesc
	ch <- resetsDesc
	ch <- unsignedDesc
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
}
