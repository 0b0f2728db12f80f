package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemoFirmware runs `demo firmware` on binaries built for the test and
// checks what it came to: B resumed mid-download and the execution is its,
// the device committed the intended image, the frozen holder's late chunk
// and late fw.activate were refused stale, and the summary says so.
func TestDemoFirmware(t *testing.T) {
	o := demoTestOptions(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	res, err := demoFirmware(ctx, o, &out, &errOut)
	if err != nil {
		t.Fatalf("demo firmware: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("demo output:\n%s", out.String())
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
	if res.FaultAt.Bytes == 0 || res.FaultAt.Bytes >= res.Size || res.LateActivate.Verdict != "stale" {
		t.Fatalf("fault at %d of %d bytes, late activate %+v", res.FaultAt.Bytes, res.Size, res.LateActivate)
	}
	for _, want := range []string{"fw.chunk ×", "gw-b", "stale (late: after A woke)", "fw.activate", "succeeded",
		"committed", "the frozen holder's late chunk and late fw.activate were refused stale at the device"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo does not say %q", want)
		}
	}
}
