package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
)

// TestWatchCompactedWhileCut: a Watch cut off from etcd while the
// revisions it needs are compacted lists again when the connection is
// back: Resync changes for what is there, Deleted for a job gone
// meanwhile; then it carries on with changes.
func TestWatchCompactedWhileCut(t *testing.T) {
	st, direct := newStore(t)
	ctx := ctxT(t)
	for _, id := range []string{"fw-1", "fw-2"} {
		if _, _, err := st.Create(ctx, testJob(id, "dev-1")); err != nil {
			t.Fatal(err)
		}
	}
	proxy, wcli, err := testEtcd.CutClient()
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	defer wcli.Close()
	prefix := st.JobKey("")[:len(st.JobKey(""))-len("/jobs/")]
	wctx, cancel := context.WithCancel(context.Background())
	ch := jobs.NewStore(wcli, prefix).Watch(wctx)
	defer func() {
		cancel()
		for range ch {
		}
	}()
	next := func(what string) jobs.Change {
		t.Helper()
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatalf("%s: watch closed", what)
			}
			return c
		case <-time.After(60 * time.Second): // a hang guard, not a latency bound
			t.Fatalf("%s: nothing", what)
		}
		return jobs.Change{}
	}
	for range 4 { // two jobs, two rollouts
		if c := next("listing"); !c.Resync {
			t.Fatalf("listing: %+v", c)
		}
	}

	proxy.Cut()
	if _, err := st.SetRollout(ctx, "fw-1", jobs.RolloutPaused, "cut"); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Delete(ctx, st.JobKey("fw-2")); err != nil {
		t.Fatal(err)
	}
	r, err := direct.Get(ctx, "/jobstest/none")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Heal(); err != nil {
		t.Fatal(err)
	}
	if cc := wcli.ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}
	var paused, gone bool
	for !paused || !gone {
		c := next("resync")
		if c.Rev < r.Header.Revision {
			t.Fatalf("change %+v from before the compaction at %d", c, r.Header.Revision)
		}
		if !c.Resync {
			t.Fatalf("after the compaction: %+v, want a resync", c)
		}
		paused = paused || c.Rollout != nil && c.ID == "fw-1" && c.Rollout.Status == jobs.RolloutPaused
		gone = gone || c.ID == "fw-2" && c.Doc == jobs.DocJob && c.Deleted
	}
	if _, err := st.SetRollout(ctx, "fw-1", jobs.RolloutActive, ""); err != nil {
		t.Fatal(err)
	}
	for {
		c := next("after resync")
		if !c.Resync && c.Rollout != nil && c.Rollout.Status == jobs.RolloutActive {
			break
		}
	}
}
