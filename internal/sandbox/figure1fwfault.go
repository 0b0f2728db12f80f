package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// arm sets the tap to land the run's fault on A at its step, before the
// job exists: a download through the runner's window can be over in well
// under a second, so no poll of the execution could catch its middle.
func (f *figure1fw) arm() <-chan struct{} {
	switch f.c.Fault {
	case FaultFreezeMidDownload:
		return f.tap.arm(onChunkOfA(uint64(f.c.ImageSize), f.a.Freeze, tapHold))
	case FaultKillMidDownload:
		return f.tap.arm(onChunkOfA(uint64(f.c.ImageSize), f.a.Kill, tapPass))
	case FaultKillAfterInstall:
		return f.tap.arm(onStepOfA(fwjob.KindActivate, f.a.Kill, tapDrop))
	case FaultFreezeAfterInstall:
		return f.tap.arm(onStepOfA(fwjob.KindActivate, f.a.Freeze, tapHold))
	case FaultFreezeDuringReboot:
		return f.tap.arm(onReport(f.job, fwjob.Rebooting, f.a.Freeze))
	}
	return f.tap.arm(onReport(f.job, fwjob.Rebooting, f.a.Kill)) // FaultKillDuringReboot
}

// fault waits for the fault armed (arm) to land on A, then until B holds
// the device.
func (f *figure1fw) fault(ctx context.Context, fired <-chan struct{}, res *Figure1FirmwareResult) error {
	select {
	case <-fired:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the fault's moment: %w", ctx.Err())
	}
	f.faultAt, res.FaultAt = f.tap.firing()
	f.say("%s — the device reported %s at %d of %d bytes (token %d)", f.faultWords(), res.FaultAt.State,
		res.FaultAt.Bytes, res.Size, res.FaultAt.Token)
	toks, err := f.waitHolding(ctx, f.b, f.sockB)
	if err != nil {
		return err
	}
	res.TokenB = toks[f.c.Device]
	f.say("A's lease expired; B holds %s with token %d, %.1fs after the fault", f.c.Device, res.TokenB,
		time.Since(f.faultAt).Seconds())
	return nil
}

// onStepOfA is a tap trigger on gw-a's first command of kind: it runs do
// (freeze or kill A) and does act with the command.
func onStepOfA(kind string, do func() error, act tapAction) func(tapEvent) (tapAction, bool) {
	return func(ev tapEvent) (tapAction, bool) {
		if s := ev.Step; s == nil || s.Holder != "gw-a" || s.Kind != kind {
			return tapPass, false
		}
		_ = do() // an error: A already exited, which the run's checks show
		return act, true
	}
}

// onReport is a tap trigger on the device's first report of job in
// state: it runs do (freeze or kill A) and passes the report on.
func onReport(job string, state fwjob.State, do func() error) func(tapEvent) (tapAction, bool) {
	return func(ev tapEvent) (tapAction, bool) {
		if r := ev.Report; r == nil || r.Job != job || r.State != string(state) {
			return tapPass, false
		}
		_ = do()
		return tapPass, true
	}
}

// onChunkOfA is a tap trigger on gw-a's first fw.chunk past a third of an
// image of size bytes: it runs do (freeze or kill A) and does act with it.
func onChunkOfA(size uint64, do func() error, act tapAction) func(tapEvent) (tapAction, bool) {
	return func(ev tapEvent) (tapAction, bool) {
		if s := ev.Step; s == nil || s.Holder != "gw-a" || s.Kind != fwjob.KindChunk || s.Off*3 < size {
			return tapPass, false
		}
		_ = do()
		return act, true
	}
}

func (f *figure1fw) faultWords() string {
	switch f.c.Fault {
	case FaultFreezeMidDownload:
		return "A is frozen (SIGSTOP) as its next chunk leaves it; the network holds that chunk until A wakes"
	case FaultKillMidDownload:
		return "A is killed (kill -9) in the middle of the download"
	case FaultFreezeAfterInstall:
		return "A is frozen (SIGSTOP) as its fw.activate leaves it, the image installed; the network holds it until A wakes"
	case FaultKillAfterInstall:
		return "A is killed (kill -9) right after the device installed the image, its fw.activate lost with it"
	case FaultFreezeDuringReboot:
		return "A is frozen (SIGSTOP) while the device reboots into the new image after A's fw.activate, before its confirming report"
	}
	return "A is killed (kill -9) while the device reboots into the new image, before its confirming report"
}

// awaitEnd polls the execution until it ended, and narrates how B resumed.
func (f *figure1fw) awaitEnd(ctx context.Context, res *Figure1FirmwareResult) error {
	err := f.poll(ctx, "the execution's end", func() (bool, error) {
		var err error
		res.Execution, err = f.execution(ctx)
		return res.Execution.Status.Terminal(), err
	})
	if err != nil {
		return err
	}
	steps, _ := f.tap.snapshot()
	var b []string
	for _, s := range steps {
		if s.Holder != "gw-b" {
			continue
		}
		w := s.Kind
		if s.Kind == fwjob.KindChunk {
			w = fmt.Sprintf("fw.chunk@%d", s.Off)
		}
		if len(b) == 0 || s.Kind != fwjob.KindChunk || !strings.HasPrefix(b[len(b)-1], "fw.chunk") {
			b = append(b, w+" "+s.Verdict)
		} else if !strings.HasSuffix(b[len(b)-1], "…") {
			b[len(b)-1] += " …"
		}
	}
	f.say("B resumed from the device's report: %s", strings.Join(b, ", "))
	f.say("edgefence job show: %s %s by %s under token %d%s", res.Execution.Device, res.Execution.Status, res.Execution.Gateway,
		res.Execution.Token, reasonWords(res.Execution.Reason))
	return nil
}

func reasonWords(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

// wake resumes the frozen A once B is done: the step it was sending (held
// in the broker) reaches the device; frozen during the reboot (nothing
// held), a fw.commit is sent through it. Then a fw.activate is sent
// through it.
func (f *figure1fw) wake(ctx context.Context, res *Figure1FirmwareResult) error {
	res.Frozen = time.Since(f.faultAt)
	var err error
	if f.c.Fault.heldKind() != "" {
		err = f.wakeHeld(ctx, res)
	} else if err = f.a.Resume(); err == nil {
		f.wokeAt = time.Now()
		f.say("A wakes (SIGCONT) after %.1fs, still believing it holds the lease", res.Frozen.Seconds())
		res.LateCommit, err = f.sendKind(ctx, f.sockA, f.c.Device, fwjob.KindCommit, fmt.Sprintf(`{"job":%q}`, f.job))
		if err == nil {
			f.say("edgefence send --socket A %s fw.commit: %s%s", f.c.Device, res.LateCommit.Verdict, reasonWords(res.LateCommit.Error))
		}
	}
	if err != nil {
		return err
	}
	res.LateActivate, err = f.sendKind(ctx, f.sockA, f.c.Device, fwjob.KindActivate, fmt.Sprintf(`{"job":%q}`, f.job))
	if err != nil {
		return err
	}
	f.say("edgefence send --socket A %s fw.activate: %s%s", f.c.Device, res.LateActivate.Verdict, reasonWords(res.LateActivate.Error))
	return nil
}

// wakeHeld resumes A and releases its step held in the broker; it waits
// for the device's verdict on it and for A to count it stale.
func (f *figure1fw) wakeHeld(ctx context.Context, res *Figure1FirmwareResult) error {
	steps, _ := f.tap.snapshot()
	var id string
	for _, s := range steps {
		if s.Holder == "gw-a" && s.Kind == f.c.Fault.heldKind() && s.Verdict == "" {
			id = s.ID
		}
	}
	if id == "" {
		return errors.New("sandbox: figure 1 firmware: no step of A's held in the broker at the freeze")
	}
	if err := f.a.Resume(); err != nil {
		return err
	}
	f.wokeAt = time.Now()
	f.tap.releaseHeld()
	var late FirmwareStep
	err := f.poll(ctx, "the device's verdict on A's late step", func() (bool, error) {
		var ok bool
		late, ok = f.tap.step(id)
		return ok && late.Verdict != "", nil
	})
	if err != nil {
		return err
	}
	what := late.Kind
	if late.Kind == fwjob.KindChunk {
		what = fmt.Sprintf("chunk at offset %d", late.Off)
	}
	f.say("A wakes (SIGCONT) after %.1fs, still believing it holds the lease; its %s (token %d) reaches the device: %s",
		res.Frozen.Seconds(), what, late.Token, late.Verdict)
	return f.poll(ctx, "A's count of its stale step", func() (bool, error) {
		st, err := f.status(ctx, f.sockA)
		if err != nil || st.Jobs == nil {
			return false, err
		}
		res.AStale = st.Jobs.Steps[late.Kind]["stale"]
		return res.AStale > 0, nil
	})
}

// Check verifies the outcome every firmware failover run must have: the
// execution succeeded, written by gw-b under B's token (above A's); the
// device runs the intended image, committed once, activated once; the
// steps the device accepted never went back in token; B resumed where
// the device was (no offset written twice); and, for the frozen holder,
// every late step of A was refused stale at the device.
func (r *Figure1FirmwareResult) Check() error {
	var errs []error
	e := r.Execution
	if e.Status != jobs.Succeeded || e.Gateway != "gw-b" || e.Token != r.TokenB || r.TokenB <= r.TokenA {
		errs = append(errs, fmt.Errorf("execution %s by %s under token %d (%s); want succeeded by gw-b under B's token %d > A's %d",
			e.Status, e.Gateway, e.Token, e.Reason, r.TokenB, r.TokenA))
	}
	if r.Final.Job != r.Job || r.Final.State != string(fwjob.Committed) || r.Final.Image != r.Image || r.SlotSHA256 != r.Image {
		errs = append(errs, fmt.Errorf("device: %s %s, image %s, slot %s file %s; want %s committed with %s",
			r.Final.Job, r.Final.State, r.Final.Image, r.Final.Slot, r.SlotSHA256, r.Job, r.Image))
	}
	errs = append(errs, r.checkSteps(), r.checkFault())
	return errors.Join(errs...)
}

// checkSteps checks the device's accepted steps: tokens never decrease,
// chunks each offset once in order, one activate, one commit (and one
// committed report).
func (r *Figure1FirmwareResult) checkSteps() error {
	var errs []error
	var max fence.Token
	var next uint64
	n := map[string]int{}
	for _, s := range r.Steps {
		if s.Verdict != "accepted" {
			continue
		}
		if s.Token < max {
			errs = append(errs, fmt.Errorf("%s accepted under token %d after %d", s.Kind, s.Token, max))
		}
		max = s.Token
		n[s.Kind]++
		if s.Kind == fwjob.KindChunk {
			if s.Off != next {
				errs = append(errs, fmt.Errorf("chunk at %d accepted after %d bytes", s.Off, next))
			}
			next = s.Off + min(r.Chunk, r.Size-s.Off)
		}
	}
	commits := 0
	prev := ""
	for _, rep := range r.Reports {
		if rep.Job == r.Job && rep.State == string(fwjob.Committed) && prev != rep.State {
			commits++
		}
		prev = rep.State
	}
	if n[fwjob.KindActivate] != 1 || n[fwjob.KindCommit] != 1 || commits != 1 || next != r.Size {
		errs = append(errs, fmt.Errorf("accepted %d activate, %d commit, %d of %d bytes; %d committed reports; want one each and every byte",
			n[fwjob.KindActivate], n[fwjob.KindCommit], next, r.Size, commits))
	}
	return errors.Join(errs...)
}

// checkFault checks what the fault asks: where it hit, what B did after
// it, and A's late steps.
func (r *Figure1FirmwareResult) checkFault() error {
	var bKinds []string
	for _, s := range r.Steps {
		if s.Holder == "gw-b" {
			bKinds = append(bKinds, s.Kind)
		}
	}
	switch r.Fault {
	case FaultFreezeMidDownload, FaultKillMidDownload:
		if r.FaultAt.State != string(fwjob.Downloading) || len(bKinds) == 0 || bKinds[0] != fwjob.KindChunk {
			return fmt.Errorf("fault at %s, B's steps %v; want mid-download, B resuming with chunks", r.FaultAt.State, bKinds)
		}
	case FaultKillAfterInstall, FaultFreezeAfterInstall:
		if r.FaultAt.State != string(fwjob.Installed) || len(bKinds) == 0 || bKinds[0] != fwjob.KindActivate {
			return fmt.Errorf("fault at %s, B's steps %v; want installed, B activating", r.FaultAt.State, bKinds)
		}
	case FaultKillDuringReboot, FaultFreezeDuringReboot:
		if r.FaultAt.State != string(fwjob.Rebooting) || len(bKinds) == 0 || bKinds[0] != fwjob.KindCommit {
			return fmt.Errorf("fault at %s, B's steps %v; want rebooting, B committing", r.FaultAt.State, bKinds)
		}
	}
	if r.Fault.frozen() {
		return r.checkLate()
	}
	return nil
}

// checkLate: A's held step (or, frozen during the reboot, its late
// fw.commit) and its late activate were refused stale at the device, and
// A counted its held step stale.
func (r *Figure1FirmwareResult) checkLate() error {
	var errs []error
	held, kind := 0, r.Fault.lateKind()
	for _, s := range r.Late {
		if s.Verdict != "stale" {
			errs = append(errs, fmt.Errorf("late %s of A (token %d): %q %s", s.Kind, s.Token, s.Verdict, s.Reason))
		}
		if s.Kind == kind {
			held++
		}
	}
	if held == 0 {
		errs = append(errs, fmt.Errorf("no late %s of A reached the device", kind))
	}
	if r.LateActivate.Verdict != "stale" {
		errs = append(errs, fmt.Errorf("late fw.activate of A: %q %s", r.LateActivate.Verdict, r.LateActivate.Error))
	}
	if r.Fault.heldKind() != "" && r.AStale == 0 {
		errs = append(errs, fmt.Errorf("gw-a counted no stale %s", kind))
	}
	if r.Fault.heldKind() == "" && r.LateCommit.Verdict != "stale" {
		errs = append(errs, fmt.Errorf("late fw.commit of A: %q %s", r.LateCommit.Verdict, r.LateCommit.Error))
	}
	if !slices.Contains(r.ALogStale, kind) || !slices.Contains(r.ALogStale, fwjob.KindActivate) {
		errs = append(errs, fmt.Errorf("gw-a's log has stale refusals of %v; want %s and fw.activate", r.ALogStale, kind))
	}
	for _, s := range r.Late {
		if !slices.Contains(r.DeviceLogStale, s.ID) {
			errs = append(errs, fmt.Errorf("the device's log has no stale refusal of A's late %s %s", s.Kind, s.ID))
		}
	}
	return errors.Join(errs...)
}

// readLogs reads A's log and the device's for their stale refusals of
// A's commands (Figure1FirmwareResult.ALogStale, DeviceLogStale).
func (f *figure1fw) readLogs(res *Figure1FirmwareResult) error {
	a, err := os.ReadFile(f.path("gw-a.log"))
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(a, []byte("\n")) {
		var l struct {
			Msg, Verdict, Kind string
			Token              fence.Token
		}
		if json.Unmarshal(line, &l) == nil && l.Msg == "command refused" && l.Verdict == "stale" && l.Token == res.TokenA {
			res.ALogStale = append(res.ALogStale, l.Kind)
		}
	}
	d, err := os.ReadFile(filepath.Join(f.path("devices"), f.c.Device, "devsim.log"))
	if err != nil {
		return err
	}
	tok := fmt.Sprintf(" token=%d ", res.TokenA)
	for _, line := range strings.Split(string(d), "\n") {
		if !strings.Contains(line, `msg="stale command refused"`) || !strings.Contains(line, tok) || !strings.Contains(line, " holder=gw-a ") {
			continue
		}
		if _, rest, ok := strings.Cut(line, " id="); ok {
			id, _, _ := strings.Cut(rest, " ")
			res.DeviceLogStale = append(res.DeviceLogStale, id)
		}
	}
	return nil
}
