package main

import (
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	r := edgefence(t, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "edgefence ") || !strings.Contains(r.stdout, "(commit ") ||
		!strings.Contains(r.stdout, runtime.Version()) {
		t.Fatalf("version output:\n%s", r)
	}
}
