package bridge

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Environment of TestBridgeHelperProcess beyond its spec: the failpoints.
const (
	// crashEnv names a command id: the helper SIGKILLs itself when that
	// command is about to be written to the device, after its admit
	// committed.
	crashEnv = "EDGEFENCE_BRIDGE_CRASH_BEFORE_WIRE"
	// holdEnv names a command id: the helper holds that command before
	// the wire until a resend of it waits for it.
	holdEnv = "EDGEFENCE_BRIDGE_HOLD_UNTIL_RESENT"
	// historyEnv is the file the helper's bridge records its history in.
	historyEnv = "EDGEFENCE_BRIDGE_HISTORY"
)

// helperHistory opens the helper process's history, if the test asks for
// one: the table records its accepts there (before each commit), the
// bridge its refusals and what the device applied.
func helperHistory() (*history.Writer, error) {
	path := os.Getenv(historyEnv)
	if path == "" {
		return nil, nil
	}
	return history.Create(path, "table:helper")
}

// helperHooks sets the failpoints of the helper process on cfg; br is the
// bridge once New returned.
func helperHooks(cfg *Config, br **Bridge) error {
	crash, hold := os.Getenv(crashEnv), os.Getenv(holdEnv)
	cfg.beforeWire = func(env *fence.Envelope) {
		switch env.ID {
		case crash:
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		case hold:
			deadline := time.Now().Add(20 * time.Second)
			for (*br).waiting(env) == 0 && time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	return nil
}

// waiting returns how many resends wait for env's command.
func (b *Bridge) waiting(env *fence.Envelope) int {
	p := b.devices[env.Device]
	p.mu.Lock()
	defer p.mu.Unlock()
	if j := p.pending[fence.Mark{Token: env.Token, Seq: env.Seq}]; j != nil {
		return len(j.waiters)
	}
	return 0
}

// helper runs TestBridgeHelperProcess with spec and extra environment and
// waits for it to be ready.
func helper(t *testing.T, spec string, env ...string) *exec.Cmd {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestBridgeHelperProcess$")
	child.Env = append(append(os.Environ(), killEnv+"="+spec), env...)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if sc.Text() == "ready" {
			go func() {
				for sc.Scan() { // drain
				}
			}()
			return child
		}
		if strings.HasPrefix(sc.Text(), "error") {
			child.Process.Kill()
			child.Wait()
			t.Fatalf("helper: %s", sc.Text())
		}
	}
	child.Wait()
	t.Fatal("helper exited before ready")
	return nil
}

func writeEnv(t *testing.T, dev string, tok fence.Token, seq uint64, value uint16) *fence.Envelope {
	t.Helper()
	body, err := fence.EncodeBody(map[string]any{"addr": 0, "value": value})
	if err != nil {
		t.Fatal(err)
	}
	return &fence.Envelope{V: fence.Version, Device: dev, Token: tok, Seq: seq, ID: fmt.Sprintf("%s-%d-%d", dev, tok, seq),
		Kind: modbus.KindWriteRegister, Body: body, Holder: "holder"}
}

func appliedValues(t *testing.T, log *syncBuffer) []uint16 {
	t.Helper()
	var vs []uint16
	for _, a := range log.applied(t) {
		vs = append(vs, a.Values[0])
	}
	return vs
}

// The gateway dies (SIGKILL) after the fence table committed a command and
// before the command reached the wire. When it restarts it delivers the
// command before anything else; the holder's resend, which the table calls
// a duplicate, is answered only after the device applied the command; the
// device applies it exactly once; and the history says so in that order.
func TestCrashBetweenAdmitAndWire(t *testing.T) {
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := t.TempDir()
	table, hist := filepath.Join(dir, "fence.db"), filepath.Join(dir, "history.jsonl")
	log := &syncBuffer{}
	regs := legacy.NewRegisters("c1", 4, log)
	spec := b.URL() + "|" + table + "|c1=" + serveDevice(t, regs)
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "crash-holder", CleanStart: true},
		mqtt.Topics{Prefix: "kill"}, []string{"c1"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)
	if err := awaitSubscribed(cmdr); err != nil { // else the first ack may reach nobody
		t.Fatal(err)
	}
	send := func(env *fence.Envelope, timeout time.Duration) (*fence.Ack, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return cmdr.Send(ctx, env)
	}

	first, lost, next := writeEnv(t, "c1", 3, 1, 11), writeEnv(t, "c1", 3, 2, 22), writeEnv(t, "c1", 3, 3, 33)
	child := helper(t, spec, crashEnv+"="+lost.ID, historyEnv+"="+hist)
	if a, err := send(first, 20*time.Second); err != nil || a.Verdict != fence.Accepted {
		t.Fatalf("first: %+v %v", a, err)
	}
	if a, err := send(lost, 2*time.Second); err == nil {
		t.Fatalf("the command the gateway died on was answered: %+v", a)
	}
	err = child.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die of SIGKILL at the failpoint: %v", err)
	}
	if vs := appliedValues(t, log); len(vs) != 1 || vs[0] != 11 {
		t.Fatalf("device applied %v before the restart, want [11]", vs)
	}
	// The table vouches for 3/2 and still knows it is not applied.
	tbl, err := fence.OpenTable(table, &fence.TableOptions{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := tbl.Get("c1")
	envs, uerr := tbl.Unapplied("c1")
	tbl.Close()
	if err != nil || uerr != nil || rec.Mark != (fence.Mark{Token: 3, Seq: 2}) || len(envs) != 1 || envs[0].ID != lost.ID {
		t.Fatalf("table after the crash: mark %v %v, unapplied %+v %v", rec.Mark, err, envs, uerr)
	}

	// Restart; the helper holds the recovered command until the resend
	// waits for it, so the resend is judged while the command is unapplied.
	child = helper(t, spec, holdEnv+"="+lost.ID, historyEnv+"="+hist)
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	a, err := send(lost, 20*time.Second)
	vs := appliedValues(t, log) // as of the ack
	if err != nil || a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate {
		t.Fatalf("resend: %+v %v", a, err)
	}
	if len(vs) != 2 || vs[1] != 22 {
		t.Fatalf("resend answered %v while the device had applied %v: the ack came before the command was applied", a.Verdict, vs)
	}
	if a, err := send(next, 20*time.Second); err != nil || a.Verdict != fence.Accepted {
		t.Fatalf("next: %+v %v", a, err)
	}
	// A later resend is a plain duplicate: the command is applied.
	if a, err := send(lost, 20*time.Second); err != nil || a.Verdict != fence.Duplicate {
		t.Fatalf("late resend: %+v %v", a, err)
	}
	if vs := appliedValues(t, log); len(vs) != 3 || vs[0] != 11 || vs[1] != 22 || vs[2] != 33 {
		t.Fatalf("device applied %v, want [11 22 33]", vs)
	}

	// The history: lost was accepted (first process), applied once (second
	// process), and every duplicate verdict on it comes after that.
	evs, err := history.Read(hist)
	if err != nil {
		t.Fatal(err)
	}
	if rep := history.CheckWith(evs, history.CheckOptions{}); !rep.OK() {
		t.Fatalf("bridge history: %v", rep.Violations)
	}
	raw, _ := os.ReadFile(hist)
	var applied, accepted, dups int
	for _, e := range evs {
		line := fmt.Sprintf("%+v", e)
		if e.ID != lost.ID {
			continue
		}
		switch {
		case e.Op == history.OpApplied:
			applied++
		case e.Op == history.OpVerdict && e.Verdict == "accepted":
			accepted++
		case e.Op == history.OpVerdict && e.Verdict == "duplicate":
			if applied == 0 {
				t.Errorf("duplicate verdict recorded before the command was applied: %s", line)
			}
			dups++
		default:
			t.Errorf("unexpected event %s", line)
		}
	}
	if applied != 1 || accepted != 1 || dups != 2 {
		t.Fatalf("history of %s: %d applied, %d accepted, %d duplicate; want 1, 1, 2:\n%s", lost.ID, applied, accepted, dups, raw)
	}
}

// The table's commit comes before the wire: when the table cannot commit
// (here it is closed under the running bridge), the command is answered
// Invalid and not one byte of it reaches the device.
func TestNoCommitNothingOnTheWire(t *testing.T) {
	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := r.startBridgeWith(Config{Table: tbl})
	if a := r.write(4, 1, 41); a.Verdict != fence.Accepted {
		t.Fatalf("first: %+v", a)
	}
	// The first command is marked applied just after its ack.
	deadline := time.Now().Add(10 * time.Second)
	for len(tableUnapplied(t, tbl)) != 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	before := r.dev.resp.Stats().Requests
	if err := tbl.Close(); err != nil {
		t.Fatal(err)
	}
	a := r.write(4, 2, 42)
	if a.Verdict == fence.Accepted || a.Verdict == fence.Duplicate || !strings.Contains(a.Reason, "fence table") {
		t.Fatalf("command the table could not commit: %+v", a)
	}
	if n := r.dev.resp.Stats().Requests; n != before {
		t.Fatalf("%d requests reached the device after the table failed", n-before)
	}
	if v := r.register(); v != 41 {
		t.Fatalf("register %d", v)
	}
	if st := br.Stats(); st.TableErrors != 1 || st.Accepted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A resend of a command that is still queued behind another (the holder
// gave up waiting and sent it again) is answered only once the command was
// applied, and the device applies it once.
func TestResendWhileQueuedWaits(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	var br *Bridge
	held := writeEnv(t, "plc-1", 2, 1, 5)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	br, _ = r.startBridgeWith(Config{Table: tbl, beforeWire: func(env *fence.Envelope) {
		if env.ID == held.ID {
			<-release
		}
	}})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the bridge's stop, so a failing test does not hang in Close
	// A second holder's client sends the same envelope again while the
	// first Send is still waiting.
	other, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "holder-again", CleanStart: true},
		r.topics, []string{"plc-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(other.Close)
	if err := awaitSubscribed(other); err != nil {
		t.Fatal(err)
	}
	type res struct {
		a   *fence.Ack
		err error
	}
	firstDone, againDone := make(chan res, 1), make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a, err := r.cmdr.Send(ctx, held)
		firstDone <- res{a, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(tableUnapplied(t, tbl)) == 0 && time.Now().Before(deadline) { // admitted
		time.Sleep(2 * time.Millisecond)
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a, err := other.Send(ctx, held)
		againDone <- res{a, err}
	}()
	for br.waiting(held) == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if br.waiting(held) != 1 {
		t.Fatal("the resend does not wait for the queued command")
	}
	select {
	case got := <-againDone:
		t.Fatalf("resend answered before the command was applied: %+v %v", got.a, got.err)
	default:
	}
	free()
	if got := <-firstDone; got.err != nil || got.a.Verdict != fence.Accepted {
		t.Fatalf("first: %+v %v", got.a, got.err)
	}
	// Both clients see both acks (same id): the command's Accepted and
	// the resend's Duplicate; either answers the resend truthfully now.
	if got := <-againDone; got.err != nil || got.a.Verdict != fence.Accepted && got.a.Verdict != fence.Duplicate {
		t.Fatalf("resend: %+v %v", got.a, got.err)
	}
	if vs := appliedValues(t, r.dev.log); len(vs) != 1 || vs[0] != 5 {
		t.Fatalf("applied %v", vs)
	}
	// Marked applied right after the ack, before the device's next command.
	deadline = time.Now().Add(10 * time.Second)
	for len(tableUnapplied(t, tbl)) != 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if n := len(tableUnapplied(t, tbl)); n != 0 {
		t.Fatalf("%d commands still unapplied in the table", n)
	}
}

func tableUnapplied(t *testing.T, tbl *fence.Table) []*fence.Envelope {
	t.Helper()
	envs, err := tbl.Unapplied("plc-1")
	if err != nil {
		t.Fatal(err)
	}
	return envs
}

// awaitSubscribed waits until the commander's ack subscription is in
// place: an ack published before it reaches nobody.
func awaitSubscribed(c *mqtt.Commander) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Client().AwaitSubscribed(ctx)
}
