package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent/jobs"
)

func cmdJobShow(args []string, stdout, stderr io.Writer) error {
	f := newEtcdCmdFlags("job", "show", " ID", stderr)
	watch := f.fs.Bool("watch", false, "redraw on every change of the rollout or an execution, until Ctrl-C")
	id, err := jobID(f, args)
	if err != nil {
		return err
	}
	if !*watch {
		return withJobs(f, func(ctx context.Context, conn *jobConn) error {
			v, err := readJobView(ctx, conn.store, id)
			if err != nil {
				return fmt.Errorf("job show %s: %w", id, conn.etcdErr(err))
			}
			return drawJob(stdout, v, f.asJSON, time.Time{})
		})
	}
	conn, err := openJobs(f)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, stop := signalContext()
	defer stop()
	err = watchJob(ctx, conn, id, f.timeout, func(v jobView) error { return drawJob(stdout, v, f.asJSON, time.Now()) })
	if ctx.Err() != nil {
		return nil // Ctrl-C
	}
	return err
}

// readJobView reads the job, its rollout and its executions.
func readJobView(ctx context.Context, st *jobs.Store, id string) (jobView, error) {
	j, err := st.Job(ctx, id)
	if err != nil {
		return jobView{}, err
	}
	r, err := st.Rollout(ctx, id)
	if err != nil {
		return jobView{}, err
	}
	ex, err := st.Executions(ctx, id)
	if err != nil && ex == nil {
		return jobView{}, err
	}
	return jobView{Job: j, Rollout: r, Executions: ex}, nil
}

// watchJob draws the job, then again after every change of its rollout
// or executions (the changes that arrived together drawn once), until
// ctx ends. A watch that ends (compaction, lost connection) starts again
// from a new read.
func watchJob(ctx context.Context, conn *jobConn, id string, timeout time.Duration, draw func(jobView) error) error {
	st := conn.store
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		head, err := conn.cli.Get(rctx, st.RolloutKey(id), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return conn.etcdErr(err)
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		from := clientv3.WithRev(head.Header.Revision + 1)
		rw := conn.cli.Watch(wctx, st.RolloutKey(id), from)
		ew := conn.cli.Watch(wctx, st.IndexKey(id, ""), clientv3.WithPrefix(), from)
		err = followJob(ctx, st, id, timeout, rw, ew, draw)
		wcancel()
		if err != nil {
			return conn.etcdErr(err)
		}
	}
	return nil
}

// followJob draws the job now and on every watch response, until ctx
// ends (nil) or a watch ends (nil: watch again).
func followJob(ctx context.Context, st *jobs.Store, id string, timeout time.Duration, rw, ew clientv3.WatchChan, draw func(jobView) error) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		v, err := readJobView(rctx, st, id)
		cancel()
		if err != nil {
			return err
		}
		if err := draw(v); err != nil {
			return err
		}
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case wr, ok = <-rw:
		case wr, ok = <-ew:
		}
		if !ok || wr.Err() != nil || wr.Canceled {
			return nil
		}
	drain: // changes that arrived meanwhile: one drawing for them all
		for {
			select {
			case wr, ok = <-rw:
			case wr, ok = <-ew:
			default:
				break drain
			}
			if !ok || wr.Err() != nil || wr.Canceled {
				return nil
			}
		}
	}
}

// drawJob prints a job view: JSON on one line with --json and --watch
// (at set), indented JSON with --json alone, else for people.
func drawJob(w io.Writer, v jobView, asJSON bool, at time.Time) error {
	switch {
	case asJSON && !at.IsZero():
		b, err := json.Marshal(struct {
			Time time.Time `json:"time"`
			jobView
		}{at.UTC(), v})
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case asJSON:
		return writeJSON(w, v)
	}
	if !at.IsZero() {
		fmt.Fprintf(w, "── %s ──\n", at.Format("15:04:05.000"))
	}
	return printJob(w, v)
}

// printJob writes a job for people: the job, the rollout, a table of the
// devices' executions.
func printJob(w io.Writer, v jobView) error {
	j, r := v.Job, v.Rollout
	fmt.Fprintf(w, "job %s: %s\n", j.ID, imageText(j.Image))
	fmt.Fprintf(w, "  url %s\n", j.Image.URL)
	fmt.Fprintf(w, "  targets: %s\n", targetsText(j.Targets))
	fmt.Fprintf(w, "  created %s by %s\n", j.Created.UTC().Format(time.RFC3339), orDash(j.By))
	fmt.Fprintf(w, "rollout: %s", r.Status)
	if r.Reason != "" {
		fmt.Fprintf(w, " (%s)", r.Reason)
	}
	fmt.Fprintf(w, ", updated %s\n  policy: %s\n  counts: %s\n\n", r.Updated.UTC().Format(time.RFC3339), policyText(j, r), countsText(r.Counts))
	if len(v.Executions) == 0 {
		_, err := fmt.Fprintln(w, "no executions yet (gateways create them as they take up the job)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATUS\tSTEP\tPROGRESS\tGATEWAY\tTOKEN\tREASON\tUPDATED")
	for _, e := range v.Executions {
		status := string(e.Status)
		if e.Canary {
			status += " (canary)"
		}
		tok := "-"
		if e.Token != 0 {
			tok = strconv.FormatUint(uint64(e.Token), 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Device, status, orDash(e.Step), progressText(e.Bytes, e.Size),
			orDash(e.Gateway), tok, orDash(e.Reason), e.Updated.UTC().Format("15:04:05"))
	}
	return tw.Flush()
}

func printJobList(w io.Writer, views []jobView) error {
	if len(views) == 0 {
		_, err := fmt.Fprintln(w, "no jobs")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tROLLOUT\tQUEUED\tIN_PROGRESS\tSUCCEEDED\tFAILED\tTIMED_OUT\tREJECTED\tCANCELED\tIMAGE\tVERSION\tCREATED")
	for _, v := range views {
		c := v.Rollout.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n", v.Job.ID, orDash(string(v.Rollout.Status)),
			c[jobs.Queued], c[jobs.InProgress], c[jobs.Succeeded], c[jobs.Failed], c[jobs.TimedOut], c[jobs.Rejected], c[jobs.Canceled],
			orDash(v.Job.Image.Name), v.Job.Image.Version, v.Job.Created.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// imageText is "fw.bin v3 (sha256 0123456789ab…, 1048576 bytes)".
func imageText(img jobs.ImageRef) string {
	sum := img.SHA256
	if len(sum) > 12 {
		sum = sum[:12] + "…"
	}
	s := fmt.Sprintf("%s v%d (sha256 %s, %d bytes", orDash(img.Name), img.Version, sum, img.Size)
	if len(img.Manifest) > 0 {
		s += ", signed manifest"
	}
	return s + ")"
}

func targetsText(t jobs.Targets) string {
	var parts []string
	if len(t.Devices) > 0 {
		parts = append(parts, fmt.Sprintf("%d devices %s", len(t.Devices), strings.Join(t.Devices, ",")))
	}
	if len(t.Match) > 0 {
		parts = append(parts, "matching "+strings.Join(t.Match, ","))
	}
	return strings.Join(parts, "; ")
}

func policyText(j jobs.Job, r jobs.Rollout) string {
	p := j.Rollout
	s := fmt.Sprintf("max_concurrent %d", p.MaxConcurrent)
	if p.PerMinute > 0 {
		s += fmt.Sprintf(", %d/min", p.PerMinute)
	}
	if p.Canary > 0 {
		s += fmt.Sprintf(", canary %d (%d left, %d running)", p.Canary, r.CanaryLeft, r.CanaryRunning)
	}
	if p.Abort.FailureRatio > 0 {
		s += fmt.Sprintf(", abort at %.0f%% failed after %d", 100*p.Abort.FailureRatio, p.Abort.MinExecutions)
	}
	return s
}

// countsText is the non-zero counts, in status order.
func countsText(c map[jobs.Status]int) string {
	var parts []string
	for _, s := range jobs.Statuses {
		if c[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, c[s]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func progressText(n, size uint64) string {
	if size == 0 {
		if n == 0 {
			return "-"
		}
		return strconv.FormatUint(n, 10)
	}
	return fmt.Sprintf("%d/%d %d%%", n, size, n*100/size)
}
