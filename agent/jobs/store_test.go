package jobs_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/agent/jobs"
)

func TestStoreCreateGetList(t *testing.T) {
	st, _ := newStore(t)
	ctx := ctxT(t)
	j := testJob("fw-b", "dev-1", "dev-2")
	j.Rollout.Canary = 1
	got, r, err := st.Create(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if got.Chunk != jobs.DefaultChunk || got.Rollout.MaxConcurrent != jobs.DefaultMaxConcurrent || got.Created.IsZero() {
		t.Fatalf("defaults not applied: %+v", got)
	}
	if r.Status != jobs.RolloutActive || r.CanaryLeft != 1 || r.Rev == 0 {
		t.Fatalf("rollout %+v", r)
	}
	if _, _, err := st.Create(ctx, j); !errors.Is(err, jobs.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	bad := testJob("fw-bad")
	bad.Image.Size = 0
	if _, _, err := st.Create(ctx, bad); !errors.Is(err, jobs.ErrInvalidJob) {
		t.Fatalf("invalid create: %v", err)
	}
	if _, _, err := st.Create(ctx, testJob("fw-a", "dev-1")); err != nil {
		t.Fatal(err)
	}
	if one, err := st.Job(ctx, "fw-b"); err != nil || one.ID != "fw-b" || len(one.Targets.Devices) != 2 {
		t.Fatalf("Job: %+v %v", one, err)
	}
	if _, err := st.Job(ctx, "nope"); !errors.Is(err, jobs.ErrNoJob) {
		t.Fatalf("Job(nope): %v", err)
	}
	if _, err := st.Rollout(ctx, "nope"); !errors.Is(err, jobs.ErrNoJob) {
		t.Fatalf("Rollout(nope): %v", err)
	}
	all, err := st.Jobs(ctx)
	if err != nil || len(all) != 2 || all[0].ID != "fw-a" || all[1].ID != "fw-b" {
		t.Fatalf("Jobs: %+v %v", all, err)
	}
	if got, err := st.Rollout(ctx, "fw-b"); err != nil || got.Rev != r.Rev || got.CanaryLeft != 1 {
		t.Fatalf("Rollout: %+v %v", got, err)
	}
}

func TestStoreExecutionLifecycle(t *testing.T) {
	st, cli := newStore(t)
	ctx := ctxT(t)
	if _, _, err := st.Create(ctx, testJob("fw-1", "dev-1")); err != nil {
		t.Fatal(err)
	}
	h := lockDevice(t, cli, st, "dev-1", "gw-a").Holder
	if e, err := st.Execution(ctx, "dev-1", "fw-1"); err != nil || e.Rev != 0 || e.Status != "" {
		t.Fatalf("absent execution: %+v %v", e, err)
	}
	e, err := st.Queue(ctx, "dev-1", "fw-1", h)
	if err != nil || e.Status != jobs.Queued || e.Version != 1 || e.Rev == 0 {
		t.Fatalf("Queue: %+v %v", e, err)
	}
	if again, err := st.Queue(ctx, "dev-1", "fw-1", h); err != nil || again.Rev != e.Rev {
		t.Fatalf("second Queue: %+v %v", again, err)
	}
	if e, err = st.Start(ctx, e, h); err != nil || e.Status != jobs.InProgress || e.Version != 2 {
		t.Fatalf("Start: %+v %v", e, err)
	}
	e.Step, e.Bytes, e.Size = "downloading", 100, 1000
	if e, err = st.Update(ctx, e, h); err != nil || e.Version != 3 {
		t.Fatalf("Update: %+v %v", e, err)
	}
	stale := e
	e.Bytes = 200
	if e, err = st.Update(ctx, e, h); err != nil {
		t.Fatal(err)
	}
	stale.Bytes = 300
	if _, err := st.Update(ctx, stale, h); !errors.Is(err, jobs.ErrConflict) {
		t.Fatalf("Update of a stale read: %v, want ErrConflict", err)
	}
	e, r, err := st.Finish(ctx, e, jobs.Succeeded, "committed", h)
	if err != nil || e.Status != jobs.Succeeded || r.Counts[jobs.Succeeded] != 1 || r.Counts[jobs.InProgress] != 0 {
		t.Fatalf("Finish: %+v %+v %v", e, r, err)
	}
	if r.Status != jobs.RolloutCompleted {
		t.Fatalf("rollout %s after its only device ended, want completed", r.Status)
	}
	if _, _, err := st.Finish(ctx, e, jobs.Failed, "again", h); !errors.Is(err, jobs.ErrTransition) {
		t.Fatalf("Finish of an ended execution: %v", err)
	}
	dev, err := st.Execution(ctx, "dev-1", "fw-1")
	if err != nil {
		t.Fatal(err)
	}
	list, err := st.Executions(ctx, "fw-1")
	if err != nil || len(list) != 1 || list[0] != dev || dev.Rev != e.Rev || dev.Bytes != 200 {
		t.Fatalf("Executions %+v, Execution %+v, %v", list, dev, err)
	}
}
