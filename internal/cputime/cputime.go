// Package cputime reads this process's CPU time (user + system), the
// figure the benchmarks divide by their operations (CPU per transaction,
// per command, per wait).
package cputime

import (
	"syscall"
	"time"
)

// Process is this process's CPU time so far, user + system; 0 if the
// system cannot tell.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
