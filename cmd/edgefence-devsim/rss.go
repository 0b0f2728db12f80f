package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// rssKiB is the process's resident set (VmRSS, KiB); 0 if unknown.
func rssKiB() uint64 { return procStatus("VmRSS:") }

// peakRSSKiB is the process's peak resident set (VmHWM, KiB); 0 if
// unknown.
func peakRSSKiB() uint64 { return procStatus("VmHWM:") }

// procStatus reads a "kB" field of /proc/self/status.
func procStatus(field string) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
