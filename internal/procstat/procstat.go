// Package procstat reads a process's /proc/PID/stat: the fields the
// agent's /metrics (internal/promtext), the benchmarks' CPU figures and
// the sandbox's process identity need.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// UserHZ is the unit of /proc's times: USER_HZ, 100 on every Linux
// architecture.
const UserHZ = 100

// ErrFormat is returned for a stat file that does not parse.
var ErrFormat = errors.New("procstat: unexpected /proc/PID/stat")

// Stat is what the callers need of /proc/PID/stat.
type Stat struct {
	UTime, STime uint64 // fields 14 and 15: user and system CPU, in UserHZ ticks
	StartTime    uint64 // field 22: start, in UserHZ ticks since boot
	VSize        uint64 // field 23: virtual memory, bytes
	RSS          uint64 // field 24: resident pages
}

// CPU is the process's user + system CPU time.
func (s Stat) CPU() time.Duration {
	return time.Duration(s.UTime+s.STime) * (time.Second / UserHZ)
}

// Self reads this process's stat.
func Self() (Stat, error) { return ReadFile("/proc/self/stat") }

// Read reads process pid's stat.
func Read(pid int) (Stat, error) { return ReadFile("/proc/" + strconv.Itoa(pid) + "/stat") }

// ReadFile reads and parses a /proc/PID/stat at path.
func ReadFile(path string) (Stat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, err
	}
	return Parse(b)
}

// Parse parses the contents of a /proc/PID/stat.
func Parse(b []byte) (Stat, error) {
	// The command name, field 2, is in parentheses and may hold anything:
	// the fields that follow start after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("%w: no ')'", ErrFormat)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	var s Stat
	for _, p := range []struct {
		n int
		v *uint64
	}{{14, &s.UTime}, {15, &s.STime}, {22, &s.StartTime}, {23, &s.VSize}, {24, &s.RSS}} {
		if p.n-3 >= len(f) {
			return Stat{}, fmt.Errorf("%w: %d fields", ErrFormat, len(f)+2)
		}
		v, err := strconv.ParseUint(string(f[p.n-3]), 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("%w: field %d: %w", ErrFormat, p.n, err)
		}
		*p.v = v
	}
	return s, nil
}
