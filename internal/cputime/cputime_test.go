package cputime

import "testing"

// TestProcessGrows: the CPU a busy loop spends shows in Process.
func TestProcessGrows(t *testing.T) {
	before := Process()
	if before <= 0 {
		t.Fatalf("Process() = %v at start: a running test has spent CPU", before)
	}
	x := 0
	for Process() == before {
		for i := range 1_000_000 {
			x += i
		}
	}
	_ = x
}
