package promtext

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/edgefence/edgefence/internal/procstat"
)

// ProcessCollector returns a Collector of this process's series under the
// names client_golang's process collector uses (process_cpu_seconds_total,
// process_resident_memory_bytes, process_open_fds, …), read from /proc.
// Where /proc cannot be read (not Linux), the series are left out and the
// scrape's Err says why.
func ProcessCollector() Collector { return &processCollector{proc: "/proc"} }

type processCollector struct {
	proc string // the proc file system's mount point

	once  sync.Once
	start float64 // process_start_time_seconds, 0 if unknown
	err   error   // why start is unknown
}

var (
	procCPU      = NewDesc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", TypeCounter)
	procOpenFDs  = NewDesc("process_open_fds", "Number of open file descriptors.", TypeGauge)
	procMaxFDs   = NewDesc("process_max_fds", "Maximum number of open file descriptors.", TypeGauge)
	procVirt     = NewDesc("process_virtual_memory_bytes", "Virtual memory size in bytes.", TypeGauge)
	procVirtMax  = NewDesc("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", TypeGauge)
	procResident = NewDesc("process_resident_memory_bytes", "Resident memory size in bytes.", TypeGauge)
	procStart    = NewDesc("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", TypeGauge)
)

func (c *processCollector) Collect(w *Writer) {
	st, err := procstat.ReadFile(c.proc + "/self/stat")
	if err != nil {
		w.Fail(procCPU, err)
	} else {
		w.Sample(procCPU, st.CPU().Seconds())
		w.Sample(procVirt, float64(st.VSize))
		w.Sample(procResident, float64(st.RSS)*float64(os.Getpagesize()))
		c.once.Do(func() { c.start, c.err = c.startTime(st.StartTime) })
		if c.err != nil {
			w.Fail(procStart, c.err)
		} else {
			w.Sample(procStart, c.start)
		}
	}
	if n, err := countDir(c.proc + "/self/fd"); err != nil {
		w.Fail(procOpenFDs, err)
	} else {
		w.Sample(procOpenFDs, float64(n))
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		w.Sample(procMaxFDs, float64(lim.Cur))
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &lim); err == nil {
		w.Sample(procVirtMax, float64(lim.Cur))
	}
}

// startTime is the process's start in Unix seconds: the boot time from
// /proc/stat plus starttime (ticks since boot).
func (c *processCollector) startTime(ticks uint64) (float64, error) {
	b, err := os.ReadFile(c.proc + "/stat")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			btime, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat btime: %w", err)
			}
			return float64(btime) + float64(ticks)/procstat.UserHZ, nil
		}
	}
	return 0, errors.New("/proc/stat: no btime")
}

// countDir counts a directory's entries.
func countDir(path string) (int, error) {
	d, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	return len(names), err
}
