package promtext

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
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

// userHZ is the unit of /proc's times: USER_HZ, 100 on every Linux
// architecture (what procfs assumes too).
const userHZ = 100

// errProcStat is reported for a /proc/self/stat that does not parse.
var errProcStat = errors.New("promtext: unexpected /proc/self/stat")

// procStat is what the series need of /proc/self/stat.
type procStat struct {
	utime, stime, starttime, vsize, rss uint64
}

func (c *processCollector) Collect(w *Writer) {
	st, err := readProcStat(c.proc + "/self/stat")
	if err != nil {
		w.Fail(procCPU, err)
	} else {
		w.Sample(procCPU, float64(st.utime+st.stime)/userHZ)
		w.Sample(procVirt, float64(st.vsize))
		w.Sample(procResident, float64(st.rss)*float64(os.Getpagesize()))
		c.once.Do(func() { c.start, c.err = c.startTime(st.starttime) })
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

// readProcStat parses a /proc/PID/stat.
func readProcStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	// The command name, field 2, is in parentheses and may hold anything:
	// the fields that follow start after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("%w: no ')'", errProcStat)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	field := func(n int) (uint64, error) {
		if n-3 >= len(f) {
			return 0, fmt.Errorf("%w: %d fields", errProcStat, len(f)+2)
		}
		v, err := strconv.ParseUint(string(f[n-3]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: field %d: %w", errProcStat, n, err)
		}
		return v, nil
	}
	var s procStat
	for _, p := range []struct {
		n int
		v *uint64
	}{{14, &s.utime}, {15, &s.stime}, {22, &s.starttime}, {23, &s.vsize}, {24, &s.rss}} {
		if *p.v, err = field(p.n); err != nil {
			return procStat{}, err
		}
	}
	return s, nil
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
			return float64(btime) + float64(ticks)/userHZ, nil
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
