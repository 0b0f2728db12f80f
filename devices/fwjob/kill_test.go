package fwjob_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// The child process of the kill tests: killEnv is the device directory,
// the others say where to die, which holder it is and what goes wrong.
const (
	killEnv      = "EDGEFENCE_FWJOB_KILL_DIR"
	killAtEnv    = "EDGEFENCE_FWJOB_KILL_AT" // point@n: the n-th time the point is reached
	killTokenEnv = "EDGEFENCE_FWJOB_KILL_TOKEN"
	killCaseEnv  = "EDGEFENCE_FWJOB_KILL_CASE" // ok, corrupt (a chunk altered: failed), sick (health fails: rolled_back)
	killChunkEnv = "EDGEFENCE_FWJOB_KILL_CHUNK"
)

// killImage is the image of the kill tests: 5 chunks of 4 KiB (the last
// one short) unless a chunk size is given.
func killImage(chunk int) image { return newImage("kj", 18_000, 2, chunk) }

// killMain runs in the child: it boots the device, opens its fence point
// and, as a holder of the token it was given, takes the job from wherever
// the device reports it to the end, rebooting (Boot in process) when the
// device asks to. Each decision is a line on stdout; at the crash point it
// prints "kill POINT" and SIGKILLs itself.
func killMain() int {
	dir := os.Getenv(killEnv)
	at := os.Getenv(killAtEnv)
	token, _ := strconv.ParseUint(os.Getenv(killTokenEnv), 10, 64)
	chunk, _ := strconv.Atoi(os.Getenv(killChunkEnv))
	if chunk == 0 {
		chunk = 4096
	}
	hits := map[string]int{}
	crash := func(p string) {
		hits[p]++
		if at == p+"@"+strconv.Itoa(hits[p]) {
			fmt.Printf("kill %s\n", at)
			os.Stdout.Sync()
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	h := &killHolder{dir: dir, token: fence.Token(token), im: killImage(chunk), kase: os.Getenv(killCaseEnv), crash: crash}
	if err := h.run(); err != nil {
		fmt.Println("error", err)
		return 2
	}
	return 0
}

type killHolder struct {
	dir   string
	token fence.Token
	seq   uint64
	im    image
	kase  string
	crash func(string)
	s     *shim.Shim
	d     *fwjob.Device
}

func (h *killHolder) boot() error {
	if h.s != nil {
		h.s.Close()
	}
	info, err := fwjob.Boot(context.Background(), h.dir, fwjob.WithBootCrash(bootFor(h.kase), h.crash))
	if err != nil {
		return err
	}
	fmt.Printf("boot %s %s\n", info.Slot, info.Status.State)
	h.crash("state:" + string(info.Status.State))
	if h.s, err = shim.Open(fwjob.DBPath(h.dir), nil); err != nil {
		return err
	}
	h.d, err = fwjob.New(fwjob.WithCrash(fwjob.Config{Dir: h.dir, Device: dev}, h.crash))
	return err
}

func (h *killHolder) run() error {
	if err := h.boot(); err != nil {
		return err
	}
	defer func() { h.s.Close() }()
	for range 1000 {
		st, err := h.d.Status(h.s)
		if err != nil {
			return err
		}
		kind, body, end := h.next(st)
		if end {
			fmt.Printf("end %s %s\n", st.State, st.Reason)
			return nil
		}
		if kind == "" { // the device is to reboot
			if err := h.boot(); err != nil {
				return err
			}
			continue
		}
		h.seq++
		raw, err := encode(h.token, h.seq, kind, body)
		if err != nil {
			return err
		}
		o := h.d.Handle(h.s, raw)
		fmt.Printf("ack %s %s %s %d\n", kind, o.Ack.Verdict, o.Status.State, o.Status.Bytes)
		if o.Ack.Verdict != fence.Accepted {
			return fmt.Errorf("%s refused: %s", kind, o.Ack.Reason)
		}
		h.crash("state:" + string(o.Status.State))
	}
	return errors.New("no end in 1000 steps")
}

// next is the holder's decision from the device's report: the step to
// send, "" to reboot, or the end of the job.
func (h *killHolder) next(st fwjob.Status) (kind string, body any, end bool) {
	im := h.im
	switch {
	case st.RebootPending():
		return "", nil, false
	case st.Job != im.job:
		return fwjob.KindBegin, im.begin(), false
	}
	switch st.State {
	case fwjob.Downloading:
		c := im.chunkAt(st.Bytes)
		if h.kase == "corrupt" && st.Bytes == uint64(im.chunk) {
			c.Data = slices.Clone(c.Data)
			c.Data[0] ^= 0xff
		}
		return fwjob.KindChunk, c, false
	case fwjob.Downloaded:
		return fwjob.KindInstall, im.job1(), false
	case fwjob.Installed:
		return fwjob.KindActivate, im.job1(), false
	case fwjob.Confirming:
		return fwjob.KindCommit, im.job1(), false
	}
	return "", nil, true // committed, failed, rolled_back
}

// bootFor is the device's boot configuration in a kill case: in "sick"
// the new image never passes its health check.
func bootFor(kase string) fwjob.BootConfig {
	if kase == "sick" {
		return fwjob.BootConfig{Health: func(context.Context, fwjob.BootInfo) error { return errors.New("sick") }}
	}
	return fwjob.BootConfig{}
}

// child runs the helper on dir until it ends or kills itself at point;
// it returns the lines it printed and whether it was killed.
func child(t *testing.T, dir, point, kase string, token int, chunk int, killAfter time.Duration) ([]string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killEnv+"="+dir, killAtEnv+"="+point, killCaseEnv+"="+kase,
		killTokenEnv+"="+strconv.Itoa(token), killChunkEnv+"="+strconv.Itoa(chunk))
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if killAfter > 0 {
		timer := time.AfterFunc(killAfter, func() { cmd.Process.Signal(syscall.SIGKILL) })
		defer timer.Stop()
	}
	err := cmd.Wait()
	var lines []string
	for sc := bufio.NewScanner(&out); sc.Scan(); {
		lines = append(lines, sc.Text())
	}
	if err == nil {
		return lines, false
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return lines, true
		}
	}
	t.Fatalf("child: %v; said %q", err, lines)
	return nil, false
}

// checkBoot boots dir (as the device would after the power came back)
// and checks that what boots is consistent: the booted slot's file is the
// image the boot loader holds for it, the state is one of the machine's,
// and no image is active or on trial whose hash was not verified.
func checkBoot(t *testing.T, dir, kase string, im image, factory []byte) fwjob.BootInfo {
	t.Helper()
	info, err := fwjob.Boot(context.Background(), dir, bootFor(kase))
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	st := info.Status
	data, err := os.ReadFile(info.Path)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); !bytes.Equal(sum[:], info.Image) {
		t.Fatalf("booted slot %s does not hold the image the boot loader holds for it (%d bytes)", info.Slot, len(data))
	}
	if !bytes.Equal(data, factory) && !bytes.Equal(data, im.data) {
		t.Fatalf("booted slot %s holds neither the factory image nor the job's (%d bytes)", info.Slot, len(data))
	}
	if !slices.Contains(fwjob.States, st.State) {
		t.Fatalf("state %q", st.State)
	}
	for _, img := range [][]byte{st.ActiveImage, st.TrialImage} {
		if img != nil && !bytes.Equal(img, im.sum()) && !bytes.Equal(img, sha(factory)) {
			t.Fatalf("the boot loader holds an image that is neither: %x", img)
		}
	}
	if st.Trial != "" && (!info.Trial || st.State != fwjob.Confirming) {
		t.Fatalf("a trial armed but not booted, or booted with the job %s: %+v", st.State, info)
	}
	if st.Active != fwjob.SlotA && st.State != fwjob.Committed {
		t.Fatalf("slot %s active with the job %s", st.Active, st.State)
	}
	return info
}

func sha(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// newKillDir is a fresh device directory with its factory image.
func newKillDir(t *testing.T) (string, []byte) {
	dir := t.TempDir()
	factory := []byte("factory image v1")
	if err := os.WriteFile(fwjob.SlotPath(dir, fwjob.SlotA), factory, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, factory
}

// TestKill9AtEveryStep kills the device (SIGKILL, from inside, at a named
// point) in every state and between every write and the commit that
// records it, boots it again, checks the boot, and lets a new holder take
// the job to its end: committed with the intended image (or, where the job
// was meant to fail, failed or rolled back with the old image running).
func TestKill9AtEveryStep(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	type kill struct {
		point, kase string
		check       func(t *testing.T, st fwjob.Status)
	}
	bytesAt := func(n uint64) func(*testing.T, fwjob.Status) {
		return func(t *testing.T, st fwjob.Status) {
			if st.State != fwjob.Downloading || st.Bytes != n {
				t.Fatalf("after the kill: %s with %d bytes, want downloading with %d (the record never moved)", st.State, st.Bytes, n)
			}
		}
	}
	state := func(s fwjob.State) func(*testing.T, fwjob.Status) {
		return func(t *testing.T, st fwjob.Status) {
			if st.State != s {
				t.Fatalf("after the kill: %s (%s), want %s", st.State, st.Reason, s)
			}
		}
	}
	kills := []kill{
		{"begin.reset@1", "ok", state(fwjob.Idle)},
		{"state:downloading@1", "ok", bytesAt(0)},
		{"chunk.written@1", "ok", bytesAt(0)},
		{"state:downloading@2", "ok", bytesAt(4096)},
		{"chunk.written@3", "ok", bytesAt(8192)},
		{"chunk.written@5", "ok", bytesAt(16384)}, // the last chunk
		{"state:downloaded@1", "ok", state(fwjob.Downloaded)},
		{"install.verify@1", "ok", state(fwjob.Installed)}, // installing, settled by Boot
		{"state:installed@1", "ok", state(fwjob.Installed)},
		{"state:rebooting@1", "ok", state(fwjob.Confirming)},
		{"boot.armed@2", "ok", state(fwjob.Confirming)}, // the trial boot, before its health check
		{"boot.health@1", "ok", state(fwjob.Confirming)},
		{"state:confirming@1", "ok", state(fwjob.Confirming)},
		{"state:committed@1", "ok", state(fwjob.Committed)},
		{"state:failed@1", "corrupt", state(fwjob.Failed)},
		{"state:rolled_back@1", "sick", state(fwjob.RolledBack)},
		{"boot.health@1", "sick", state(fwjob.RolledBack)},
	}
	for i, k := range kills {
		t.Run(strings.ReplaceAll(k.point, ":", "-")+"/"+k.kase, func(t *testing.T) {
			dir, factory := newKillDir(t)
			im := killImage(4096)
			lines, killed := child(t, dir, k.point, k.kase, 100+i, 4096, 0)
			if !killed || !slices.Contains(lines, "kill "+k.point) {
				t.Fatalf("the child was not killed at %s: %q", k.point, lines)
			}
			info := checkBoot(t, dir, k.kase, im, factory)
			k.check(t, info.Status)
			lines, killed = child(t, dir, "", k.kase, 200+i, 4096, 0)
			end := checkBoot(t, dir, k.kase, im, factory).Status
			want := map[string]fwjob.State{"ok": fwjob.Committed, "corrupt": fwjob.Failed, "sick": fwjob.RolledBack}[k.kase]
			if killed || end.State != want || end.Job != im.job {
				t.Fatalf("after the restart: %+v (child said %q)", end, lines)
			}
			running, _ := os.ReadFile(fwjob.SlotPath(dir, end.Slot))
			if want == fwjob.Committed && (!bytes.Equal(running, im.data) || end.Security != im.version) ||
				want != fwjob.Committed && !bytes.Equal(running, factory) {
				t.Fatalf("%s and running slot %s (%d bytes, security %d)", end.State, end.Slot, len(running), end.Security)
			}
		})
	}
}

// TestKill9Random kills the device at random moments of a job in small
// chunks (so that most kills land in a chunk's slot write or record
// commit, or in the bbolt commit itself) and checks every boot; the job
// then ends committed with the intended image. Each child lives a random
// part of a sixth of the time one whole job takes on this machine.
func TestKill9Random(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	const chunk = 32
	im := killImage(chunk)
	scratch, _ := newKillDir(t)
	start := time.Now()
	if _, killed := child(t, scratch, "", "ok", 1, chunk, 0); killed {
		t.Fatal("the timing run was killed")
	}
	whole := time.Since(start)

	dir, factory := newKillDir(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	var states []string
	for round := range 12 {
		d := time.Duration(rng.Int64N(int64(whole)/6)) + time.Millisecond
		_, killed := child(t, dir, "", "ok", 300+round, chunk, d)
		st := checkBoot(t, dir, "ok", im, factory).Status
		states = append(states, fmt.Sprintf("%s/%d", st.State, st.Bytes))
		if !killed {
			break
		}
	}
	lines, _ := child(t, dir, "", "ok", 400, chunk, 0)
	end := checkBoot(t, dir, "ok", im, factory).Status
	running, _ := os.ReadFile(fwjob.SlotPath(dir, end.Slot))
	if end.State != fwjob.Committed || !bytes.Equal(running, im.data) {
		t.Fatalf("end %+v; last child said %q", end, lines[max(0, len(lines)-3):])
	}
	t.Logf("a whole job takes %v; state after each kill: %v", whole, states)
}
