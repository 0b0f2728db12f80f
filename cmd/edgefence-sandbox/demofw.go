package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// demoFirmware runs `edgefence-sandbox demo firmware`: a firmware job over
// two gateways (sandbox.RunFigure1Firmware, the frozen holder): A is frozen
// mid-download, B takes the device over and resumes from the bytes the
// device reports, A's late chunk and late fw.activate are refused stale,
// and the device ends committed with the intended image.
func demoFirmware(ctx context.Context, o demoOptions, stdout, stderr io.Writer) (*sandbox.Figure1FirmwareResult, error) {
	start := time.Now()
	w, auth, err := startDemoWorld(ctx, o.dir, stderr)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	fmt.Fprintf(stdout, "edgefence demo firmware — a firmware update handed over mid-download, on real parts:\n")
	fmt.Fprintf(stdout, "  etcd %s (embedded), MQTT v5 broker %s (mochi, with passwords and an ACL),\n", w.Etcd.Endpoint(), w.Broker.URL())
	fmt.Fprintf(stdout, "  two agents (edgefence run), a firmware device (edgefence-devsim --firmware: A/B slots, a reboot is a process exit),\n")
	fmt.Fprintf(stdout, "  the job made and read with `edgefence job create` and `edgefence job show --json`.\n\n")
	dir := filepath.Join(o.dir, "firmware")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res, err := sandbox.RunFigure1Firmware(ctx, sandbox.Figure1FirmwareConfig{AgentBin: o.agentBin, DevsimBin: o.devsimBin, Dir: dir,
		Etcd: w.Etcd.Endpoint(), Broker: w.Broker, Auth: auth, Fault: sandbox.FaultFreezeMidDownload, Narrate: stdout})
	if err != nil {
		return nil, err
	}
	if err := res.Check(); err != nil {
		return nil, fmt.Errorf("the fence did not hold: %w", err)
	}
	fmt.Fprintf(stdout, "\n")
	fwSummary(stdout, res)
	fmt.Fprintf(stdout, "\n=> B resumed at byte %d, %.1fs after A froze; the device committed the intended image once, %.1fs after it;\n"+
		"   the frozen holder's late chunk and late fw.activate were refused stale at the device.\n",
		res.FaultAt.Bytes, res.ToFirstStep.Seconds(), res.ToCommitted.Seconds())
	fmt.Fprintf(stdout, "\ndemo finished in %.1fs\n", time.Since(start).Seconds())
	return res, nil
}

// fwSummary prints the device's steps as a table: runs of chunks
// folded, one row per holder, kind and verdict.
func fwSummary(out io.Writer, r *sandbox.Figure1FirmwareResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "step\tgateway\ttoken\tdevice's verdict\n")
	var last *sandbox.FirmwareStep
	var from uint64
	n := 0
	flush := func() {
		if last == nil {
			return
		}
		what := last.Kind
		if last.Kind == "fw.chunk" {
			what = fmt.Sprintf("fw.chunk ×%d (bytes %d–%d)", n, from, min(last.Off+r.Chunk, r.Size))
		}
		late := ""
		if last.Holder == "gw-a" && last.Verdict == "stale" {
			late = " (late: after A woke)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s%s\n", what, last.Holder, last.Token, last.Verdict, late)
	}
	for i := range r.Steps {
		s := &r.Steps[i]
		if last != nil && s.Kind == "fw.chunk" && last.Kind == s.Kind && last.Holder == s.Holder && last.Verdict == s.Verdict {
			last, n = s, n+1
			continue
		}
		flush()
		last, from, n = s, s.Off, 1
	}
	flush()
	fmt.Fprintf(tw, "execution\t%s\t%d\t%s\n", r.Execution.Gateway, r.Execution.Token, r.Execution.Status)
	fmt.Fprintf(tw, "device\t\t\tslot %s %s, image %s… (slot file SHA-256 %s…)\n", r.Final.Slot, r.Final.State, r.Final.Image[:12], r.SlotSHA256[:12])
	tw.Flush()
}
