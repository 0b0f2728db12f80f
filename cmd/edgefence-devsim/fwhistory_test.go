package main

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestFirmwareHistory: device processes (--firmware) append their fence
// decisions to one --history file, each under its own source. A job with
// a kill -9 of the device mid-download, a failover to a newer holder, the
// deposed holder's late chunk (stale) and a reboot checks clean
// (history.Check), every firmware step naming its job.
func TestFirmwareHistory(t *testing.T) {
	url, dir := startBroker(t), t.TempDir()
	hpath := filepath.Join(t.TempDir(), "fw.jsonl")
	k := newFWCommander(t, url, mqtt.Topics{})
	d := startFirmware(t, url, dir, "fw-h1,fw-h2", "--history", hpath)
	for _, dev := range []string{"fw-h1", "fw-h2"} {
		k.awaitReport(t, dev, "after the boot", func(r fwReport) bool { return r.FW.State == "idle" })
	}
	k.holder("fw-h2", 5).must(t, sim.KindSet, sim.SetBody{Setpoint: ptr(19.0)})

	im := newFWImage(t, "j-h", 60_000, 1, sim.VersionMarker+"5.0")
	old := k.holder("fw-h1", 100)
	old.must(t, fwjob.KindBegin, im.begin())
	sent := old.download(t, im, 0, func(sent uint64) bool { return sent >= 2*uint64(im.chunk) })
	pid, n := pidOf(t, dir, "fw-h1"), k.count("fw-h1")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitNewPID(t, d, dir, "fw-h1", pid)
	r := k.awaitReportFrom(t, "fw-h1", n, "after the restart", func(fwReport) bool { return true })
	if r.FW.Bytes != sent {
		t.Fatalf("after kill -9 at %d bytes: %+v", sent, r)
	}
	next := k.holder("fw-h1", 200)
	off := next.download(t, im, sent, func(uint64) bool { return true })
	if a := old.send(t, fwjob.KindChunk, im.chunkAt(off)); a.Verdict != fence.Stale {
		t.Fatalf("the deposed holder's chunk: %v %q", a.Verdict, a.Reason)
	}
	next.download(t, im, off, nil)
	next.must(t, fwjob.KindInstall, im.jobBody())
	k.awaitReport(t, "fw-h1", "installed", func(r fwReport) bool { return r.FW.State == "installed" })
	next.must(t, fwjob.KindActivate, im.jobBody())
	k.awaitReport(t, "fw-h1", "confirming", func(r fwReport) bool { return r.FW.State == "confirming" })
	next.must(t, fwjob.KindCommit, im.jobBody())
	d.stop(t, syscall.SIGTERM)

	evs := checkHistory(t, hpath)
	stale, activated := map[string]bool{}, 0
	for _, e := range evs {
		if e.Op != history.OpVerdict || e.Source != "devsim:"+e.Device {
			continue
		}
		if fwjob.IsKind(e.Kind) && e.Job != im.job {
			t.Fatalf("firmware event without its job: %+v", e)
		}
		switch {
		case e.Kind == fwjob.KindChunk && e.Verdict == "stale":
			stale[e.ID] = true
		case e.Kind == fwjob.KindActivate && e.Verdict == "accepted":
			activated++
		}
	}
	// The late chunk is stale; so may be a redelivery of one the old holder
	// sent before the kill (its PUBACK died with the process) if it comes
	// after the new holder's first step.
	if late := fmt.Sprintf("fw-h1-%d-%d", old.token, old.seq); !stale[late] || activated != 1 {
		t.Fatalf("stale chunks %v (want %s among them), %d accepted fw.activate (want 1)", stale, late, activated)
	}
}
