// Package promtext writes the Prometheus text exposition format (version
// 0.0.4) and serves it over HTTP: metric families described once
// (Desc), samples written at scrape time by collectors (Collector), a
// histogram to observe into (Histogram), and the Go runtime's and the
// process's series under the names client_golang gives them (GoCollector,
// ProcessCollector).
//
// It replaces the Prometheus client library in the agent: the agent
// keeps its own counters and reads them at scrape time, so all it needs
// of a client is the exposition, and the library with the collectors and
// formats it brings cost 0.76 MB of a 16 MB binary whose pages make up
// most of the agent's resident memory on a small gateway
// (docs/BENCHMARKS.md, "Agent RSS at 10 devices").
package promtext

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Type is a metric family's type, as the TYPE line says it.
type Type uint8

// The family types.
const (
	TypeUntyped Type = iota
	TypeCounter
	TypeGauge
	TypeHistogram
	TypeSummary
)

func (t Type) String() string {
	switch t {
	case TypeCounter:
		return "counter"
	case TypeGauge:
		return "gauge"
	case TypeHistogram:
		return "histogram"
	case TypeSummary:
		return "summary"
	}
	return "untyped"
}

// ErrLabels is reported (Writer.Err) for a sample given another number
// of label values than its family has label names; the sample is left
// out.
var ErrLabels = errors.New("promtext: label values do not match the family's labels")

// ErrType is reported for a family written under two types.
var ErrType = errors.New("promtext: one family name, two types")

// Desc describes a metric family: its full name, help text, type and the
// names of its labels, in the order Writer's methods take their values.
type Desc struct {
	Name, Help string
	Type       Type
	Labels     []string
}

// NewDesc returns a Desc.
func NewDesc(name, help string, typ Type, labels ...string) *Desc {
	return &Desc{Name: name, Help: help, Type: typ, Labels: labels}
}

// Writer gathers the samples of one scrape. The exposition format wants a
// family's samples together under one HELP and TYPE: collectors write in
// any order, and WriteTo writes the families sorted by name, each with its
// samples in the order they were written.
type Writer struct {
	fams  map[string]*family
	order []*family
	errs  []error
}

type family struct {
	d   *Desc
	buf []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer { return &Writer{fams: map[string]*family{}} }

// Err returns what went wrong while writing (nil if nothing did): samples
// with the wrong number of label values, families of two types, failures
// collectors reported (Fail). The samples that had none are written anyway.
func (w *Writer) Err() error { return errors.Join(w.errs...) }

// Fail records that a collector could not write d (its samples are left
// out, the others written).
func (w *Writer) Fail(d *Desc, err error) {
	w.errs = append(w.errs, fmt.Errorf("%s: %w", d.Name, err))
}

func (w *Writer) family(d *Desc) *family {
	f := w.fams[d.Name]
	if f == nil {
		f = &family{d: d}
		w.fams[d.Name] = f
		w.order = append(w.order, f)
		return f
	}
	if f.d.Type != d.Type {
		w.errs = append(w.errs, fmt.Errorf("%s: %w (%s and %s)", d.Name, ErrType, f.d.Type, d.Type))
		return nil
	}
	return f
}

// labelsOK reports whether values fit d's labels, recording the error if not.
func (w *Writer) labelsOK(d *Desc, values []string) bool {
	if len(values) == len(d.Labels) {
		return true
	}
	w.errs = append(w.errs, fmt.Errorf("%s: %w (%d values for %d labels)", d.Name, ErrLabels, len(values), len(d.Labels)))
	return false
}

// Sample writes one sample of a counter, gauge or untyped family: d.Name
// with the label values given, in d.Labels' order.
func (w *Writer) Sample(d *Desc, v float64, values ...string) {
	if !w.labelsOK(d, values) {
		return
	}
	f := w.family(d)
	if f == nil {
		return
	}
	f.buf = appendSample(f.buf, d.Name, "", d.Labels, values, "", "", v)
}

// Quantile is one quantile of a summary.
type Quantile struct{ Q, V float64 }

// Summary writes a summary: its quantiles, _sum and _count.
func (w *Writer) Summary(d *Desc, qs []Quantile, sum float64, count uint64, values ...string) {
	if !w.labelsOK(d, values) {
		return
	}
	f := w.family(d)
	if f == nil {
		return
	}
	for _, q := range qs {
		f.buf = appendSample(f.buf, d.Name, "", d.Labels, values, "quantile", formatFloat(q.Q), q.V)
	}
	f.buf = appendSample(f.buf, d.Name, "_sum", d.Labels, values, "", "", sum)
	f.buf = appendSample(f.buf, d.Name, "_count", d.Labels, values, "", "", float64(count))
}

// WriteTo writes the exposition: the families sorted by name.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	fams := slices.Clone(w.order)
	slices.SortFunc(fams, func(a, b *family) int { return strings.Compare(a.d.Name, b.d.Name) })
	var b []byte
	var n int64
	for _, f := range fams {
		b = append(b[:0], "# HELP "...)
		b = append(b, f.d.Name...)
		b = append(b, ' ')
		b = appendEscaped(b, f.d.Help, false)
		b = append(b, "\n# TYPE "...)
		b = append(b, f.d.Name...)
		b = append(b, ' ')
		b = append(b, f.d.Type.String()...)
		b = append(b, '\n')
		b = append(b, f.buf...)
		m, err := out.Write(b)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// appendSample appends one line: name+suffix{labels="values",extra="x"} v.
func appendSample(b []byte, name, suffix string, labels, values []string, extra, extraValue string, v float64) []byte {
	b = append(b, name...)
	b = append(b, suffix...)
	if len(labels) > 0 || extra != "" {
		b = append(b, '{')
		for i, l := range labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendLabel(b, l, values[i])
		}
		if extra != "" {
			if len(labels) > 0 {
				b = append(b, ',')
			}
			b = appendLabel(b, extra, extraValue)
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = appendFloat(b, v)
	return append(b, '\n')
}

func appendLabel(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, '=', '"')
	b = appendEscaped(b, value, true)
	return append(b, '"')
}

// appendEscaped escapes a help text (backslash, newline) or a label value
// (also the double quote). Invalid UTF-8 becomes U+FFFD: Prometheus refuses
// a scrape with any.
func appendEscaped(b []byte, s string, quote bool) []byte {
	s = strings.ToValidUTF8(s, "\uFFFD")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, '\\', '\\')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '"' && quote:
			b = append(b, '\\', '"')
		default:
			b = append(b, c)
		}
	}
	return b
}

func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, +1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

func formatFloat(v float64) string { return string(appendFloat(nil, v)) }
