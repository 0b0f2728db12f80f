//go:build !edgefence_unsafe

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestNoUnsafeFlag: the shipped simulator has no switch that turns the fence
// off; --unsafe-no-fence is an unknown flag there.
func TestNoUnsafeFlag(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"--mqtt", "mqtt://h", "--dir", t.TempDir(), "--devices", "a", "--unsafe-no-fence"}
	if code := run(context.Background(), args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "flag provided but not defined: -unsafe-no-fence") {
		t.Fatalf("run(%q) = %d, stderr %q; want 2, the flag unknown", args, code, errb.String())
	}
}
