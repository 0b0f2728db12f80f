package promtext

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/edgefence/edgefence/internal/cputime"
)

// parse reads an exposition with Prometheus's own parser: what a scrape
// would make of it.
func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	return mf
}

func exposition(t *testing.T, cs ...Collector) []byte {
	t.Helper()
	w := NewWriter()
	for _, c := range cs {
		c.Collect(w)
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// gather is client_golang's reading of the same samples.
func gather(t *testing.T, cs ...prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cs...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	return parse(t, b.Bytes())
}

// sortMetrics orders a family's metrics by their labels, as the registry
// does, so that two readings compare.
func sortMetrics(mf map[string]*dto.MetricFamily) {
	key := func(m *dto.Metric) string {
		var s []string
		for _, l := range m.GetLabel() {
			s = append(s, l.GetName()+"="+l.GetValue())
		}
		slices.Sort(s)
		return strings.Join(s, ",")
	}
	for _, f := range mf {
		slices.SortFunc(f.Metric, func(a, b *dto.Metric) int { return strings.Compare(key(a), key(b)) })
		for _, m := range f.Metric {
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		}
	}
}

// TestSameAsClientGolang: counters, gauges with labels (values needing
// escapes, invalid UTF-8 included), a histogram and a summary, written
// here and by client_golang, read the same by Prometheus's parser.
func TestSameAsClientGolang(t *testing.T) {
	odd := []string{"plain", `back\slash`, `qu"ote`, "new\nline", "tab\tand ünïcode", "bad\xffutf8", ""}
	help := "A help text with a \\ backslash,\na newline and \"quotes\"."

	ours := CollectorFunc(func(w *Writer) {
		c := NewDesc("t_things_total", help, TypeCounter, "kind", "device")
		g := NewDesc("t_level", "Level.", TypeGauge)
		for i, v := range odd {
			w.Sample(c, float64(i)*1.5, v, "d"+strconv.Itoa(i))
		}
		w.Sample(g, math.Inf(-1))
		h := NewHistogram([]float64{.001, .5, 1, 2.5})
		for _, v := range []float64{0, .001, .0011, .7, 3, 1e9} {
			h.Observe(v)
		}
		w.Histogram(NewDesc("t_wait_seconds", "Wait.", TypeHistogram), h)
		w.Summary(NewDesc("t_pause_seconds", "Pause.", TypeSummary, "gc"), []Quantile{{0, 1e-6}, {0.5, 2e-5}, {1, .25}}, 3.5, 7, "x")
	})

	theirs := &clientCollector{odd: odd, help: help}
	got, want := parse(t, exposition(t, ours)), gather(t, theirs)
	sortMetrics(got)
	sortMetrics(want)
	if len(got) != len(want) {
		t.Fatalf("%d families, client_golang %d", len(got), len(want))
	}
	for name, w := range want {
		if !proto.Equal(got[name], w) {
			t.Errorf("%s:\n ours   %v\n theirs %v", name, got[name], w)
		}
	}
}

// clientCollector writes TestSameAsClientGolang's samples through
// client_golang.
type clientCollector struct {
	odd  []string
	help string
}

func (c *clientCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *clientCollector) Collect(ch chan<- prometheus.Metric) {
	cd := prometheus.NewDesc("t_things_total", c.help, []string{"kind", "device"}, nil)
	for i, v := range c.odd {
		ch <- prometheus.MustNewConstMetric(cd, prometheus.CounterValue, float64(i)*1.5, strings.ToValidUTF8(v, "\uFFFD"), "d"+strconv.Itoa(i))
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("t_level", "Level.", nil, nil), prometheus.GaugeValue, math.Inf(-1))
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t_wait_seconds", Help: "Wait.", Buckets: []float64{.001, .5, 1, 2.5}})
	for _, v := range []float64{0, .001, .0011, .7, 3, 1e9} {
		h.Observe(v)
	}
	ch <- h
	ch <- prometheus.MustNewConstSummary(prometheus.NewDesc("t_pause_seconds", "Pause.", []string{"gc"}, nil), 7, 3.5,
		map[float64]float64{0: 1e-6, 0.5: 2e-5, 1: .25}, "x")
}

// TestRuntimeSeriesAsClientGolang: the Go and process collectors give
// every family client_golang's do, with its type and help (but the
// network counters, which read the whole network namespace's traffic,
// not the process's), and values that belong to this process.
func TestRuntimeSeriesAsClientGolang(t *testing.T) {
	for x := 0; cputime.Process() < 50*time.Millisecond; x++ { // a few ticks of CPU to read
	}
	got := parse(t, exposition(t, GoCollector(), ProcessCollector()))
	want := gather(t, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for name, w := range want {
		if strings.HasPrefix(name, "process_network_") {
			continue
		}
		g := got[name]
		if g == nil {
			t.Errorf("%s: missing", name)
			continue
		}
		if g.GetType() != w.GetType() || g.GetHelp() != w.GetHelp() {
			t.Errorf("%s: %v %q, client_golang %v %q", name, g.GetType(), g.GetHelp(), w.GetType(), w.GetHelp())
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("%s: client_golang has no such series", name)
		}
	}
	value := func(name string) float64 { return got[name].GetMetric()[0].GetGauge().GetValue() }
	if v := value("go_goroutines"); v < 1 {
		t.Errorf("go_goroutines %v", v)
	}
	// VmRSS moves between two readings; both are within a few MiB.
	rss := value("process_resident_memory_bytes")
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			if math.Abs(rss-kb*1024) > 16<<20 {
				t.Errorf("process_resident_memory_bytes %v, VmRSS %v kB", rss, kb)
			}
		}
	}
	if start, theirs := value("process_start_time_seconds"), want["process_start_time_seconds"].GetMetric()[0].GetGauge().GetValue(); math.Abs(start-theirs) > 0.02 {
		t.Errorf("process_start_time_seconds %v, client_golang %v", start, theirs)
	}
	if cpu := got["process_cpu_seconds_total"].GetMetric()[0].GetCounter().GetValue(); cpu <= 0 {
		t.Errorf("process_cpu_seconds_total %v", cpu)
	}
}

// TestProcWithoutProc: a /proc that cannot be read leaves its series
// out and says why; the rest of the scrape stands.
func TestProcWithoutProc(t *testing.T) {
	w := NewWriter()
	(&processCollector{proc: t.TempDir()}).Collect(w)
	if w.Err() == nil || !errors.Is(w.Err(), os.ErrNotExist) {
		t.Fatalf("Err = %v, want a missing file", w.Err())
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	mf := parse(t, b.Bytes())
	if mf["process_cpu_seconds_total"] != nil || mf["process_max_fds"] == nil {
		t.Errorf("without /proc: %s", b.String())
	}
}

// TestWriterErrors: a sample with the wrong number of label values and a
// family written under two types are left out and reported; the rest is
// written.
func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	d := NewDesc("t_a_total", "A.", TypeCounter, "x")
	w.Sample(d, 1, "one")
	w.Sample(d, 2)
	w.Sample(d, 3, "a", "b")
	w.Sample(NewDesc("t_a_total", "A.", TypeGauge, "x"), 4, "two")
	w.Fail(d, io.ErrUnexpectedEOF)
	err := w.Err()
	if !errors.Is(err, ErrLabels) || !errors.Is(err, ErrType) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Err = %v", err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	mf := parse(t, b.Bytes())
	if f := mf["t_a_total"]; len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Errorf("t_a_total: %v", f)
	}
}

// TestHistogramConcurrent: observations during scrapes; every scrape
// parses and its _count is its +Inf bucket (run under -race).
func TestHistogramConcurrent(t *testing.T) {
	h := NewHistogram([]float64{1, 2})
	d := NewDesc("t_h", "H.", TypeHistogram)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				h.Observe(float64(i % 3))
			}
		})
	}
	for range 200 {
		mf := parse(t, exposition(t, CollectorFunc(func(w *Writer) { w.Histogram(d, h) })))
		hm := mf["t_h"].GetMetric()[0].GetHistogram()
		// The parser keeps the finite buckets; the +Inf one is _count.
		for i := 1; i < len(hm.GetBucket()); i++ {
			if hm.GetBucket()[i].GetCumulativeCount() < hm.GetBucket()[i-1].GetCumulativeCount() {
				t.Fatalf("buckets not cumulative: %v", hm)
			}
		}
		if n := len(hm.GetBucket()); n > 0 && hm.GetSampleCount() < hm.GetBucket()[n-1].GetCumulativeCount() {
			t.Fatalf("_count %d below the last bucket: %v", hm.GetSampleCount(), hm)
		}
	}
	close(stop)
	wg.Wait()
}

// TestHandler: the content type, gzip when asked for (not when refused),
// and the errors told to onError with the rest still served.
func TestHandler(t *testing.T) {
	var mu sync.Mutex
	var told []error
	d := NewDesc("t_x", "X.", TypeGauge, "l")
	h := Handler(func(err error) { mu.Lock(); told = append(told, err); mu.Unlock() },
		CollectorFunc(func(w *Writer) { w.Sample(d, 1, "a"); w.Sample(d, 2) }))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct {
		accept string
		gzip   bool
	}{{"", false}, {"gzip", true}, {"deflate, gzip;q=0.5", true}, {"gzip;q=0", false}, {"identity", false}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if c.accept != "" {
			req.Header.Set("Accept-Encoding", c.accept)
		}
		res, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if ct := res.Header.Get("Content-Type"); ct != ContentType {
			t.Errorf("Content-Type %q", ct)
		}
		if gz := res.Header.Get("Content-Encoding") == "gzip"; gz != c.gzip {
			t.Errorf("Accept-Encoding %q: gzip %v", c.accept, gz)
		}
		if c.gzip {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if mf := parse(t, body); len(mf["t_x"].GetMetric()) != 1 {
			t.Errorf("Accept-Encoding %q: %s", c.accept, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 5 || !errors.Is(told[0], ErrLabels) {
		t.Errorf("onError told %v", told)
	}
}

// FuzzLabelValue: any label value and help text make an exposition
// Prometheus parses, and the value reads back (as valid UTF-8).
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"", "a", `\`, `"`, "\n", `\n`, "\xff", "}", "a=\"b\"", "#", " "} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, value, help string) {
		w := NewWriter()
		d := NewDesc("t_fuzz", help, TypeGauge, "v")
		w.Sample(d, 1, value)
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		mf := parse(t, b.Bytes())
		got := mf["t_fuzz"].GetMetric()[0].GetLabel()[0].GetValue()
		if want := strings.ToValidUTF8(value, "\uFFFD"); got != want {
			t.Fatalf("value %q read back as %q", want, got)
		}
		// The parser skips the blanks before a help text.
		if want := strings.TrimLeft(strings.ToValidUTF8(help, "\uFFFD"), " \t"); mf["t_fuzz"].GetHelp() != want {
			t.Fatalf("help %q read back as %q", want, mf["t_fuzz"].GetHelp())
		}
	})
}

// BenchmarkScrape is one scrape of the Go and process series and 1,000
// labelled samples.
func BenchmarkScrape(b *testing.B) {
	d := NewDesc("t_device_commands_total", "Commands.", TypeCounter, "device", "verdict")
	devs := make([]string, 1000)
	for i := range devs {
		devs[i] = "device-" + strconv.Itoa(i)
	}
	h := Handler(nil, GoCollector(), ProcessCollector(), CollectorFunc(func(w *Writer) {
		for i, dev := range devs {
			w.Sample(d, float64(i), dev, "accepted")
		}
	}))
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
}

// BenchmarkScrapeClientGolang is BenchmarkScrape's scrape through
// client_golang's registry and promhttp, for comparison.
func BenchmarkScrapeClientGolang(b *testing.B) {
	d := prometheus.NewDesc("t_device_commands_total", "Commands.", []string{"device", "verdict"}, nil)
	devs := make([]string, 1000)
	for i := range devs {
		devs[i] = "device-" + strconv.Itoa(i)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		constCollector(func(ch chan<- prometheus.Metric) {
			for i, dev := range devs {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(i), dev, "accepted")
			}
		}))
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
}

// constCollector is an unchecked client_golang collector (no Describe).
type constCollector func(ch chan<- prometheus.Metric)

func (constCollector) Describe(chan<- *prometheus.Desc)      {}
func (c constCollector) Collect(ch chan<- prometheus.Metric) { c(ch) }
