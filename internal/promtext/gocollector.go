package promtext

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// GoCollector returns a Collector of the Go runtime's series under the
// names and help texts client_golang's Go collector uses (go_goroutines,
// go_memstats_*, go_gc_duration_seconds, …), so dashboards and alerts
// written for those read these. They come from runtime/metrics, which does
// not stop the world, and debug.ReadGCStats.
func GoCollector() Collector {
	c := &goCollector{samples: make([]metrics.Sample, len(goMetricNames))}
	c.gc.PauseQuantiles = make([]time.Duration, len(gcQuantiles))
	for i, n := range goMetricNames {
		c.samples[i].Name = n
	}
	return c
}

type goCollector struct {
	mu      sync.Mutex // samples is read into per scrape
	samples []metrics.Sample
	gc      debug.GCStats
}

// The runtime/metrics read per scrape, in this order (the indexes below).
var goMetricNames = [...]string{
	"/memory/classes/heap/objects:bytes",          // 0
	"/gc/heap/allocs:bytes",                       // 1
	"/memory/classes/profiling/buckets:bytes",     // 2
	"/gc/heap/frees:objects",                      // 3
	"/gc/heap/tiny/allocs:objects",                // 4
	"/memory/classes/metadata/other:bytes",        // 5
	"/memory/classes/heap/released:bytes",         // 6
	"/memory/classes/heap/free:bytes",             // 7
	"/memory/classes/heap/unused:bytes",           // 8
	"/gc/heap/objects:objects",                    // 9
	"/gc/heap/allocs:objects",                     // 10
	"/memory/classes/metadata/mcache/inuse:bytes", // 11
	"/memory/classes/metadata/mcache/free:bytes",  // 12
	"/memory/classes/metadata/mspan/inuse:bytes",  // 13
	"/memory/classes/metadata/mspan/free:bytes",   // 14
	"/gc/heap/goal:bytes",                         // 15
	"/memory/classes/other:bytes",                 // 16
	"/memory/classes/heap/stacks:bytes",           // 17
	"/memory/classes/os-stacks:bytes",             // 18
	"/memory/classes/total:bytes",                 // 19
	"/gc/gogc:percent",                            // 20
	"/gc/gomemlimit:bytes",                        // 21
	"/sched/gomaxprocs:threads",                   // 22
	"/sched/goroutines:goroutines",                // 23
}

// goSeries is one go_ gauge or counter: its Desc and its value from the
// samples read (m[i] is goMetricNames[i]'s value).
type goSeries struct {
	d *Desc
	v func(m []float64) float64
}

func goGauge(name, help string, v func(m []float64) float64) goSeries {
	return goSeries{NewDesc(name, help, TypeGauge), v}
}

func goCounter(name, help string, v func(m []float64) float64) goSeries {
	return goSeries{NewDesc(name, help, TypeCounter), v}
}

var (
	goSeriesList = []goSeries{
		goGauge("go_gc_gogc_percent", "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.", at(20)),
		goGauge("go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.", at(21)),
		goGauge("go_goroutines", "Number of goroutines that currently exist.", func([]float64) float64 { return float64(runtime.NumGoroutine()) }),
		goGauge("go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.", at(0)),
		goCounter("go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.", at(1)),
		goGauge("go_memstats_buck_hash_sys_bytes", "Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes.", at(2)),
		goCounter("go_memstats_frees_total", "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.", sum(3, 4)),
		goGauge("go_memstats_gc_sys_bytes", "Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes.", at(5)),
		goGauge("go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", at(0)),
		goGauge("go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", sum(6, 7)),
		goGauge("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes", sum(0, 8)),
		goGauge("go_memstats_heap_objects", "Number of currently allocated objects. Equals to /gc/heap/objects:objects.", at(9)),
		goGauge("go_memstats_heap_released_bytes", "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.", at(6)),
		goGauge("go_memstats_heap_sys_bytes", "Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", sum(0, 8, 6, 7)),
		goCounter("go_memstats_mallocs_total", "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.", sum(10, 4)),
		goGauge("go_memstats_mcache_inuse_bytes", "Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes.", at(11)),
		goGauge("go_memstats_mcache_sys_bytes", "Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes.", sum(11, 12)),
		goGauge("go_memstats_mspan_inuse_bytes", "Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes.", at(13)),
		goGauge("go_memstats_mspan_sys_bytes", "Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes.", sum(13, 14)),
		goGauge("go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.", at(15)),
		goGauge("go_memstats_other_sys_bytes", "Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes.", at(16)),
		goGauge("go_memstats_stack_inuse_bytes", "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.", at(17)),
		goGauge("go_memstats_stack_sys_bytes", "Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes.", sum(17, 18)),
		goGauge("go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", at(19)),
		goGauge("go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.", at(22)),
	}
	goGCDuration = NewDesc("go_gc_duration_seconds", "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.", TypeSummary)
	goLastGC     = NewDesc("go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", TypeGauge)
	goThreads    = NewDesc("go_threads", "Number of OS threads created.", TypeGauge)
	goInfo       = NewDesc("go_info", "Information about the Go environment.", TypeGauge, "version")
)

func at(i int) func([]float64) float64 { return func(m []float64) float64 { return m[i] } }

func sum(is ...int) func([]float64) float64 {
	return func(m []float64) float64 {
		s := 0.0
		for _, i := range is {
			s += m[i]
		}
		return s
	}
}

// gcQuantiles are go_gc_duration_seconds' quantiles: debug.ReadGCStats
// gives the minimum, the quartiles and the maximum of the recent pauses.
var gcQuantiles = [...]float64{0, 0.25, 0.5, 0.75, 1}

func (c *goCollector) Collect(w *Writer) {
	var m [len(goMetricNames)]float64
	c.mu.Lock()
	metrics.Read(c.samples)
	for i, s := range c.samples {
		switch s.Value.Kind() {
		case metrics.KindUint64:
			m[i] = float64(s.Value.Uint64())
		case metrics.KindFloat64:
			m[i] = s.Value.Float64()
		default: // not in this Go: the series reads 0
		}
	}
	debug.ReadGCStats(&c.gc)
	qs := make([]Quantile, len(gcQuantiles))
	for i, q := range gcQuantiles {
		qs[i] = Quantile{Q: q, V: c.gc.PauseQuantiles[i].Seconds()}
	}
	numGC, pauseTotal, lastGC := c.gc.NumGC, c.gc.PauseTotal, c.gc.LastGC
	c.mu.Unlock()

	if numGC == 0 { // ReadGCStats leaves the quantiles as they were
		for i := range qs {
			qs[i].V = 0
		}
	}
	w.Summary(goGCDuration, qs, pauseTotal.Seconds(), uint64(numGC))
	for _, s := range goSeriesList {
		w.Sample(s.d, s.v(m[:]))
	}
	last := 0.0
	if !lastGC.IsZero() {
		last = float64(lastGC.UnixNano()) / 1e9
	}
	w.Sample(goLastGC, last)
	n, _ := runtime.ThreadCreateProfile(nil)
	w.Sample(goThreads, float64(n))
	w.Sample(goInfo, 1, runtime.Version())
}
