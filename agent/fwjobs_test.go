package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
)

// TestFirmwareJobCommits: a job on three devices, through a real agent,
// etcd and broker, ends succeeded on each; each device committed the
// image in its new slot, and the agent's counters say so.
func TestFirmwareJobCommits(t *testing.T) {
	w := newFWWorld(t)
	devs := []string{"fw-a", "fw-b", "fw-c"}
	for _, d := range devs {
		w.device(d, fwjob.BootConfig{})
	}
	img := w.image("v2", 40<<10+123, 2)
	job := w.createJob("j-commit", img, devs...)
	a, _ := w.agent("gw-1", devs, nil)
	for _, d := range devs {
		e := w.waitEnded(d, job.ID)
		if e.Status != jobs.Succeeded || e.Gateway != "gw-1" {
			t.Fatalf("%s: %+v", d, e)
		}
		w.devs[d].runsImage(img)
	}
	st, _ := a.JobStats()
	if st.Ended[jobs.Succeeded] != 3 || st.ImageBytes != 3*img.Size || st.Steps[fwjob.KindCommit]["accepted"] != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFirmwareJobAntiRollback: an image whose security version is below
// the device's running one is refused at fw.begin: rejected, with the
// device's reason, and the device stays idle on its old image.
func TestFirmwareJobAntiRollback(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-old", fwjob.BootConfig{Security: 5})
	job := w.createJob("j-rollback", w.image("old", 9000, 3), d.id)
	w.agent("gw-1", []string{d.id}, nil)
	e := w.waitEnded(d.id, job.ID)
	if e.Status != jobs.Rejected || !strings.Contains(e.Reason, "below the running security version 5") {
		t.Fatalf("execution %+v", e)
	}
	if st := d.status(); st.State != fwjob.Idle || st.Security != 5 {
		t.Fatalf("device %+v", st)
	}
}

// TestFirmwareJobHealthFailureRollsBack: the new image fails the device's
// health check after its trial boot: the device rolls back by itself and
// the execution fails with its reason.
func TestFirmwareJobHealthFailureRollsBack(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-sick", fwjob.BootConfig{Window: 2 * time.Second, Health: func(_ context.Context, b fwjob.BootInfo) error {
		if b.Trial {
			return errors.New("application does not come up")
		}
		return nil
	}})
	job := w.createJob("j-sick", w.image("sick", 20000, 1), d.id)
	w.agent("gw-1", []string{d.id}, nil)
	e := w.waitEnded(d.id, job.ID)
	if e.Status != jobs.Failed || !strings.HasPrefix(e.Reason, "rolled back: ") || !strings.Contains(e.Reason, "application does not come up") {
		t.Fatalf("execution %+v", e)
	}
	if st := d.status(); st.State != fwjob.RolledBack || st.Slot != fwjob.SlotA || st.Active != fwjob.SlotA {
		t.Fatalf("device %+v", st)
	}
}

// TestFirmwareJobFailoverMidDownload is the point of issue 15: the
// holder freezes in the middle of a chunk's send and loses its lease; the
// other gateway takes the device, takes the execution over under its own
// token (a fenced write) and resumes from the bytes the device reports;
// the frozen chunk, sent late, is refused stale at the device. The device
// ends committed with the intended image, no offset was ever written
// twice, and the chunks before the failover carry the first token, those
// after it the second.
func TestFirmwareJobFailoverMidDownload(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-x", fwjob.BootConfig{})
	devs := []string{d.id}
	img := w.image("fail-over", 40<<10, 1) // ten chunks of 4 KiB
	var gate *chunkGate
	a, _ := w.agent("gw-a", devs, func(s Sender) Sender { gate = newChunkGate(t, s, 4); return gate })
	waitFor(t, "gw-a holds", holdingAll(a, devs))
	b, _ := w.agent("gw-b", devs, nil)
	ta, _ := a.Holding(d.id)

	job := w.createJob("j-failover", img, devs...)
	wait(t, "gw-a's fourth chunk held", gate.held)
	if e := w.execution(d.id, job.ID); e.Status != jobs.InProgress || e.Gateway != "gw-a" || e.Token != ta {
		t.Fatalf("before the failover: %+v", e)
	}
	revokeSession(t, a)
	waitLong(t, "gw-b holds", holdingAll(b, devs))
	tb, _ := b.Holding(d.id)
	waitLong(t, "gw-b's first chunk applied", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.chunks[fmt.Sprintf("%s/%d", job.ID, 3*4096)] == tb
	})
	close(gate.release) // the frozen holder wakes and sends its chunk
	r := <-gate.result
	if r.err != nil || r.ack == nil || r.ack.Verdict != fence.Stale {
		t.Fatalf("the deposed holder's late chunk: %+v %v", r.ack, r.err)
	}

	e := w.waitEnded(d.id, job.ID)
	if e.Status != jobs.Succeeded || e.Gateway != "gw-b" || e.Token != tb {
		t.Fatalf("execution %+v", e)
	}
	d.runsImage(img)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.twice) != 0 {
		t.Fatalf("offsets written twice: %v", d.twice)
	}
	for off := uint64(0); off < img.Size; off += 4096 {
		want := tb
		if off < 3*4096 {
			want = ta
		}
		if got := d.chunks[fmt.Sprintf("%s/%d", job.ID, off)]; got != want {
			t.Errorf("chunk at %d applied under token %d, want %d", off, got, want)
		}
	}
	// The runners count a step or an end just after it happened: poll.
	waitLong(t, "gw-b counts the success", func() bool { st, _ := b.JobStats(); return st.Ended[jobs.Succeeded] == 1 })
	waitLong(t, "gw-a counts its stale chunk", func() bool { st, _ := a.JobStats(); return st.Steps[fwjob.KindChunk]["stale"] == 1 })
	if st, _ := a.JobStats(); st.Steps[fwjob.KindChunk]["stale"] != 1 || len(st.Ended) != 0 {
		t.Fatalf("gw-a stats %+v", st)
	}
}

// TestFirmwareJobPause: a paused rollout starts nothing (the executions
// wait queued); resumed, it runs to the end.
func TestFirmwareJobPause(t *testing.T) {
	w := newFWWorld(t)
	devs := []string{"fw-p1", "fw-p2"}
	for _, id := range devs {
		w.device(id, fwjob.BootConfig{})
	}
	img := w.image("paused", 10000, 1)
	job := w.createJob("j-pause", img, devs...)
	ctx := context.Background()
	if _, err := w.store.SetRollout(ctx, job.ID, jobs.RolloutPaused, "maintenance window"); err != nil {
		t.Fatal(err)
	}
	a, _ := w.agent("gw-1", devs, nil)
	for _, id := range devs {
		waitLong(t, id+" queued", func() bool { return w.execution(id, job.ID).Status == jobs.Queued })
	}
	// The runner has seen the paused rollout (it queued under it): it
	// sends nothing.
	time.Sleep(500 * time.Millisecond)
	for _, id := range devs {
		if e := w.execution(id, job.ID); e.Status != jobs.Queued {
			t.Fatalf("%s started while paused: %+v", id, e)
		}
		if st := w.devs[id].status(); st.State != fwjob.Idle {
			t.Fatalf("%s: %s while paused", id, st.State)
		}
	}
	if st, _ := a.JobStats(); len(st.Steps) != 0 {
		t.Fatalf("steps sent while paused: %v", st.Steps)
	}
	if _, err := w.store.SetRollout(ctx, job.ID, jobs.RolloutActive, ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range devs {
		if e := w.waitEnded(id, job.ID); e.Status != jobs.Succeeded {
			t.Fatalf("%s: %+v", id, e)
		}
		w.devs[id].runsImage(img)
	}
}

// TestFirmwareJobCancelMidDownload: the rollout is canceled while a
// device downloads: the runner sends fw.cancel (the device's job fails,
// its running image untouched) and the execution ends canceled.
func TestFirmwareJobCancelMidDownload(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-c", fwjob.BootConfig{})
	var gate *chunkGate
	a, _ := w.agent("gw-1", []string{d.id}, func(s Sender) Sender { gate = newChunkGate(t, s, 2); return gate })
	job := w.createJob("j-cancel", w.image("cancel", 160<<10, 1), d.id) // more chunks than a window
	wait(t, "the second chunk held", gate.held)
	seen := a.jobs.Stats().Changes
	if _, err := w.store.SetRollout(context.Background(), job.ID, jobs.RolloutCanceled, "bad batch"); err != nil {
		t.Fatal(err)
	}
	waitLong(t, "the runner sees the cancel", func() bool { return a.jobs.Stats().Changes > seen })
	close(gate.release)
	e := w.waitEnded(d.id, job.ID)
	if e.Status != jobs.Canceled || !strings.Contains(e.Reason, "bad batch") {
		t.Fatalf("execution %+v", e)
	}
	st := d.status()
	if st.State != fwjob.Failed || st.Job != job.ID || st.Bytes >= st.Size || st.Slot != fwjob.SlotA || st.Active != fwjob.SlotA {
		t.Fatalf("device %+v", st)
	}
}

// TestFirmwareJobRebootTimeout: the device's trial boot does not report
// within the job's reboot timeout (its health check hangs longer): the
// runner sends fw.cancel and the execution ends timed_out naming the step.
func TestFirmwareJobRebootTimeout(t *testing.T) {
	w := newFWWorld(t)
	d := w.device("fw-slow", fwjob.BootConfig{Window: 3 * time.Second, Health: func(ctx context.Context, b fwjob.BootInfo) error {
		if b.Trial {
			<-ctx.Done() // hangs past the window: the device rolls back by itself, too late
		}
		return nil
	}})
	job := jobs.Job{ID: "j-slow", Image: w.image("slow", 9000, 1), Chunk: w.chunk, Targets: jobs.Targets{Devices: []string{d.id}},
		Timeout: jobs.Timeouts{Step: jobs.Duration(20 * time.Second), Reboot: jobs.Duration(time.Second)}}
	if _, _, err := w.store.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	a, _ := w.agent("gw-1", []string{d.id}, nil)
	e := w.waitEnded(d.id, job.ID)
	if e.Status != jobs.TimedOut || !strings.Contains(e.Reason, "after fw.activate: none within 1s") {
		t.Fatalf("execution %+v", e)
	}
	waitLong(t, "fw.cancel sent", func() bool {
		st, _ := a.JobStats()
		return st.Steps[fwjob.KindCancel]["accepted"]+st.Steps[fwjob.KindCancel]["invalid"]+st.Steps[fwjob.KindCancel]["none"] == 1
	})
	waitLong(t, "the device back on its old image", func() bool {
		st := d.status()
		return st.State == fwjob.RolledBack && st.Slot == fwjob.SlotA
	})
}

// TestFirmwareJobManifest: a device that installs only images the
// operator signed gets the job's manifest in fw.begin and commits; a job
// without one is rejected with the device's reason.
func TestFirmwareJobManifest(t *testing.T) {
	w := newFWWorld(t)
	op := authtest.NewOperator(t)
	d := w.deviceWith("fw-signed", fwjob.BootConfig{}, op.Trust())
	unsigned := w.image("unsigned", 9000, 1)
	w.createJob("j-unsigned", unsigned, d.id)
	signed := w.image("signed", 12000, 1)
	sum, err := signed.Hash()
	if err != nil {
		t.Fatal(err)
	}
	signed.Manifest = op.Manifest(auth.Manifest{Image: sum, Size: signed.Size, Version: signed.Version, Issued: time.Now().UnixMilli()})
	w.createJob("j-signed", signed, d.id)
	w.agent("gw-1", []string{d.id}, nil)
	if e := w.waitEnded(d.id, "j-unsigned"); e.Status != jobs.Rejected || !strings.Contains(e.Reason, "manifest") {
		t.Fatalf("unsigned: %+v", e)
	}
	if e := w.waitEnded(d.id, "j-signed"); e.Status != jobs.Succeeded {
		t.Fatalf("signed: %+v", e)
	}
	d.runsImage(signed)
}
