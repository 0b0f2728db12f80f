package agent

import (
	"testing"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
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
