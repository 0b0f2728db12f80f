package promtext

import (
	"math"
	"sync/atomic"
)

// Histogram counts observations into fixed buckets, safe for concurrent
// use; Writer.Histogram writes it.
type Histogram struct {
	bounds []float64       // upper bounds, ascending
	counts []atomic.Uint64 // per bucket (not cumulative), the last one +Inf
	sum    atomic.Uint64   // float64 bits
}

// NewHistogram returns a histogram with these upper bounds (ascending; a
// +Inf bucket is implied).
func NewHistogram(bounds []float64) *Histogram {
	return &Histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Histogram writes h as d (a Histogram family): the cumulative buckets,
// _sum and _count. _count is the +Inf bucket's count, as the format wants,
// even while observations land during the scrape.
func (w *Writer) Histogram(d *Desc, h *Histogram, values ...string) {
	if !w.labelsOK(d, values) {
		return
	}
	f := w.family(d)
	if f == nil {
		return
	}
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		le := math.Inf(+1)
		if i < len(h.bounds) {
			le = h.bounds[i]
		}
		f.buf = appendSample(f.buf, d.Name, "_bucket", d.Labels, values, "le", formatFloat(le), float64(cum))
	}
	f.buf = appendSample(f.buf, d.Name, "_sum", d.Labels, values, "", "", math.Float64frombits(h.sum.Load()))
	f.buf = appendSample(f.buf, d.Name, "_count", d.Labels, values, "", "", float64(cum))
}
