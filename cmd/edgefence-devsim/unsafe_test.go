//go:build edgefence_unsafe

package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestDevsimUnsafeNoFence: a test build's --unsafe-no-fence applies a stale
// command and says so, in the acknowledgement and the log.
func TestDevsimUnsafeNoFence(t *testing.T) {
	url := startBroker(t)
	topics := mqtt.Topics{}
	k := newCommander(t, url, topics)
	d := startDevsim(t, "--mqtt", url, "--devices", "boiler", "--dir", t.TempDir(), "--unsafe-no-fence", "--log", filepath.Join(t.TempDir(), "v"))
	d.awaitReady(t)
	k.send(t, "boiler", 5, 1, sim.SetBody{Mode: ptr("cool")})
	if a := k.send(t, "boiler", 4, 1, sim.SetBody{Mode: ptr("heat")}); a.Verdict != fence.Accepted || !strings.Contains(a.Reason, "FENCE DISABLED") {
		t.Fatalf("unfenced stale: %+v", a)
	}
	d.stop(t, syscall.SIGTERM)
	if !strings.Contains(d.log(), "FENCE DISABLED") {
		t.Fatalf("no warning:\n%s", d.log())
	}
}
