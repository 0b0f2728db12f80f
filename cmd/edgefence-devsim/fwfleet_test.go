package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// startBrokerServer is startBroker for tests that look at the broker's
// clients.
func startBrokerServer(tb testing.TB) *sandbox.Broker {
	tb.Helper()
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b
}

// awaitOffline waits until no client subscribed to filter is connected
// to b (the device has gone down to reboot; its session stays).
func awaitOffline(t *testing.T, b *sandbox.Broker, filter string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		live := false
		for _, cl := range b.Server().Clients.GetAll() {
			if _, ok := cl.State.Subscriptions.Get(filter); ok && !cl.Closed() {
				live = true
			}
		}
		if !live {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("a client subscribed to %s stays connected", filter)
}

func startInProcess(t *testing.T, url, dir string, extra ...string) *devsim {
	t.Helper()
	d := startDevsim(t, append([]string{"--firmware", "--in-process", "--mqtt", url, "--dir", dir,
		"--fw-window", "20s", "--restart-delay", "50ms"}, extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("devsim log:\n%s", d.log())
		}
	})
	select { // 20 devices boot and connect: more than awaitReady's 15 s on a loaded machine
	case <-d.ready:
	case <-d.exited:
		t.Fatalf("devsim exited before ready:\n%s", d.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("devsim not ready:\n%s", d.log())
	}
	return d
}

// runJob takes device h.dev through a whole job of im: begin, download,
// install, activate (a reboot), commit. rebooting, if set, runs at once
// after fw.activate's ack, while the device goes down and up again.
func runJob(t *testing.T, k *fwCommander, h *holder, im fwImage, rebooting func()) {
	t.Helper()
	h.must(t, fwjob.KindBegin, im.begin())
	h.download(t, im, 0, nil)
	h.must(t, fwjob.KindInstall, im.jobBody())
	k.awaitReport(t, h.dev, "installed", func(r fwReport) bool { return r.FW.State == "installed" })
	h.must(t, fwjob.KindActivate, im.jobBody())
	if rebooting != nil {
		rebooting()
	}
	k.awaitReport(t, h.dev, "confirming", func(r fwReport) bool { return r.FW.State == "confirming" })
	h.must(t, fwjob.KindCommit, im.jobBody())
}

// TestFirmwareInProcess runs a firmware job on 20 devices of one
// --in-process devsim at once: every device reboots in place into its new
// slot, confirms and commits; the thermostat behind the same fence point
// keeps its state across the reboot, and a command sent right after
// fw.activate's ack is answered (never lost in the reboot). The run's --history (one file, a
// source per device) checks clean and names every step's job.
func TestFirmwareInProcess(t *testing.T) {
	const n = 20
	url, dir, hpath := startBroker(t), t.TempDir(), filepath.Join(t.TempDir(), "fw.jsonl")
	k := newFWCommander(t, url, mqtt.Topics{})
	d := startInProcess(t, url, dir, "--count", fmt.Sprint(n), "--id-prefix", "fi-", "--history", hpath)
	im := newFWImage(t, "j-fleet", 20_000, 3, sim.VersionMarker+"4.0")
	t.Run("devices", func(t *testing.T) {
		for i := 1; i <= n; i++ {
			dev := fmt.Sprintf("fi-%d", i)
			t.Run(dev, func(t *testing.T) {
				t.Parallel()
				k.awaitReport(t, dev, "after the boot", func(r fwReport) bool { return r.FW.State == "idle" })
				h := k.holder(dev, fence.Token(100+i))
				h.must(t, sim.KindSet, sim.SetBody{Setpoint: ptr(20.5)})
				runJob(t, k, h, im, func() {
					// Decided before the device goes down or after it is back. One
					// decided as it goes down may lose its ack with the connection:
					// the broker's redelivery, or our resend after 2 s without an
					// ack, is then answered duplicate (applied once).
					if a := h.sendEvery(t, sim.KindSet, sim.SetBody{Setpoint: ptr(21.5)}, 2*time.Second); a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
						t.Fatalf("a command during the reboot: %v %q", a.Verdict, a.Reason)
					}
				})
				r := k.awaitReport(t, dev, "committed", func(r fwReport) bool { return r.FW.State == "committed" })
				if r.FW.Slot != "b" || r.FW.Image != im.hex() || r.FW.Version != 3 || r.Firmware != "4.0" || r.Setpoint != 21.5 || r.Applied != 2 {
					t.Fatalf("after the commit: %+v", r)
				}
			})
		}
	})
	d.stop(t, syscall.SIGTERM)
	if !strings.Contains(d.log(), fmt.Sprintf("reboots=%d power_losses=0", n)) {
		t.Fatalf("want %d reboots in the stopped line:\n%s", n, d.log())
	}
	evs := checkHistory(t, hpath)
	activated := map[string]int{}
	for _, e := range evs {
		if !fwjob.IsKind(e.Kind) {
			continue
		}
		if e.Job != im.job || e.Source != "devsim:"+e.Device || (e.Kind == fwjob.KindBegin) != (e.Image != "") ||
			e.Image != "" && e.Image != im.hex() {
			t.Fatalf("firmware event %+v", e)
		}
		if e.Kind == fwjob.KindActivate && e.Verdict == "accepted" {
			activated[e.Device]++
		}
	}
	if len(activated) != n {
		t.Fatalf("accepted fw.activate per device: %v", activated)
	}
	for dev, c := range activated {
		if c != 1 {
			t.Fatalf("%s: %d accepted fw.activate of one job", dev, c)
		}
	}
}

// checkHistory reads a history file, checks it (history.Check) and its
// line sizes (each line one write(2) to the O_APPEND file that several
// writers share), and returns its events.
func checkHistory(t *testing.T, path string) []history.Event {
	t.Helper()
	evs, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	r := history.Check(evs)
	if !r.OK() || r.FenceVerdicts["accepted"] == 0 {
		t.Fatalf("history check:\n%s", r)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	longest, lines := 0, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		longest, lines = max(longest, len(sc.Text())+1), lines+1
	}
	if lines != len(evs) || longest >= 4096 {
		t.Fatalf("%d lines for %d events, the longest %d bytes", lines, len(evs), longest)
	}
	t.Logf("history: %d events, the longest line %d bytes; %d accepted, %d invalid, %d stale, %d devices",
		len(evs), longest, r.FenceVerdicts["accepted"], r.FenceVerdicts["invalid"], r.FenceVerdicts["stale"], r.Devices)
	return evs
}

// TestFirmwareInProcessRollback: in-process devices roll back images whose
// health check fails, never answers or crashes the device (a crash
// abandons the boot as a power loss, each try spent until the boot loader
// gives up). A command sent while a device is down rebooting waits at the
// broker and is decided once the device is back: its report is the
// rolled-back device's.
func TestFirmwareInProcessRollback(t *testing.T) {
	b, dir := startBrokerServer(t), t.TempDir()
	url, topics := b.URL(), mqtt.Topics{Prefix: "site-i/v1"}
	k := newFWCommander(t, url, topics)
	d := startInProcess(t, url, dir, "--devices", "fi-fail,fi-hang,fi-crash", "--prefix", topics.Prefix, "--fw-tries", "2",
		"--fw-window", "3s", "--history", filepath.Join(dir, "h.jsonl"))
	t.Run("images", func(t *testing.T) {
		for _, tt := range []struct{ dev, health, reason string }{
			{"fi-fail", sim.HealthFail, "image marked EDGEFENCE-HEALTH=fail"},
			{"fi-hang", sim.HealthHang, "did not pass within 3s"},
			{"fi-crash", sim.HealthCrash, "trial boots exhausted"},
		} {
			t.Run(tt.health, func(t *testing.T) {
				t.Parallel()
				k.awaitReport(t, tt.dev, "after the boot", func(r fwReport) bool { return r.FW.State == "idle" })
				h := k.holder(tt.dev, 7)
				im := newFWImage(t, "j-"+tt.health, 20_000, 0, sim.HealthMarker+tt.health)
				h.must(t, fwjob.KindBegin, im.begin())
				h.download(t, im, 0, nil)
				h.must(t, fwjob.KindInstall, im.jobBody())
				h.must(t, fwjob.KindActivate, im.jobBody())
				if tt.health == sim.HealthHang { // down for the 3 s window: the command waits for it
					awaitOffline(t, b, topics.Cmd(tt.dev))
					h.must(t, sim.KindSet, sim.SetBody{Setpoint: ptr(18.0)})
					r := k.awaitReport(t, tt.dev, "after the set", func(r fwReport) bool { return r.Applied == 1 })
					if r.FW.State != "rolled_back" || r.Setpoint != 18 {
						t.Fatalf("the report after a command sent during the reboot: %+v", r)
					}
				}
				r := k.awaitReport(t, tt.dev, "rolled back", func(r fwReport) bool { return r.FW.State == "rolled_back" })
				if r.FW.Slot != "a" || r.FW.Image != emptySum() || !strings.Contains(r.FW.Reason, tt.reason) {
					t.Fatalf("after the reboot: %+v, want rolled back to slot a with %q", r, tt.reason)
				}
				if a := h.send(t, fwjob.KindCommit, im.jobBody()); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "state rolled_back") {
					t.Fatalf("commit after the roll back: %v %q", a.Verdict, a.Reason)
				}
			})
		}
	})
	d.stop(t, syscall.SIGTERM)
	crashes := regexp.MustCompile(`msg="image crashed the device during its health check \(power loss\): booting again" device=fi-crash`)
	if n := len(crashes.FindAllString(d.log(), -1)); n != 2 {
		t.Fatalf("the crashing image abandoned %d boots, want 2 (its tries):\n%s", n, d.log())
	}
	checkHistory(t, filepath.Join(dir, "h.jsonl"))
}

// BenchmarkFirmwareInProcess starts $EDGEFENCE_FWFLEET_N (default 1000)
// firmware devices in one --in-process devsim on a fresh directory, then
// again on the same directories (a restart), against an in-process broker
// (in the test process, not the devsim's), and reports the time to
// msg=ready (every device booted, connected, subscribed and its retained
// report published) and the devsim's RSS then.
func BenchmarkFirmwareInProcess(b *testing.B) {
	n := 1000
	if s := os.Getenv("EDGEFENCE_FWFLEET_N"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			b.Fatal(err)
		}
	}
	url := startBroker(b)
	for range b.N {
		dir := b.TempDir()
		for _, run := range []string{"fresh", "restart"} {
			t0 := time.Now()
			d := startDevsim(b, "--firmware", "--in-process", "--mqtt", url, "--dir", dir, "--count", fmt.Sprint(n))
			select {
			case <-d.ready:
			case <-d.exited:
				b.Fatalf("devsim exited before ready:\n%s", d.log())
			case <-time.After(10 * time.Minute):
				b.Fatalf("devsim not ready:\n%s", d.log())
			}
			ready := time.Since(t0)
			rss := childRSSKiB(b, d.cmd.Process.Pid)
			b.ReportMetric(ready.Seconds(), run+"-ready-s")
			b.ReportMetric(float64(rss)/1024, run+"-rss-MiB")
			b.Logf("%d devices, %s: ready in %v, RSS %d MiB (%d KiB per device); %s", n, run, ready.Round(time.Millisecond),
				rss/1024, rss/uint64(n), readyLine(d.log()))
			if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				b.Fatal(err)
			}
			<-d.exited
			d.cmd.Wait()
		}
	}
}

// readyLine returns the msg=ready line of a devsim log.
func readyLine(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "msg=ready") {
			return l
		}
	}
	return ""
}

// childRSSKiB reads the VmRSS of process pid.
func childRSSKiB(tb testing.TB, pid int) uint64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kib uint64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kib)
			return kib
		}
	}
	tb.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
