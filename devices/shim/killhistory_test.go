package shim_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// historyHelperEnv names the directory (fence.db, shim.jsonl) of a
// re-executed test binary that decides the commands it reads on stdin
// until it is killed (see historyHelperMain).
const historyHelperEnv = "EDGEFENCE_SHIM_HISTORY_HELPER"

// loadDevices are the devices of TestKill9History: TxAppliers (counter),
// and one device with a plain Apply.
var loadDevices = []string{"dev-0", "dev-1", "dev-2", "dev-p"}

// deviceFor is the Device the helper decides dev's commands with.
func deviceFor(dev string) shim.Device {
	if dev == "dev-p" {
		return &recorder{}
	}
	return counter{}
}

// historyHelperMain runs in the child: a shim with a history, one goroutine
// per device deciding the commands that stdin names ("dev token seq id"),
// printing "ack id verdict" once Handle returns. It closes the shim when
// stdin ends.
func historyHelperMain() int {
	dir := os.Getenv(historyHelperEnv)
	h, err := history.Create(filepath.Join(dir, "shim.jsonl"), "shim")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	s, err := shim.Open(filepath.Join(dir, "fence.db"), &shim.Options{History: h})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	var (
		wg      sync.WaitGroup
		workers = map[string]chan []byte{}
	)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var (
			dev, id  string
			tok, seq uint64
		)
		if _, err := fmt.Sscan(sc.Text(), &dev, &tok, &seq, &id); err != nil {
			fmt.Fprintln(os.Stderr, "helper: bad command:", sc.Text())
			return 2
		}
		raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: fence.Token(tok), Seq: seq,
			ID: id, Kind: "ok", Holder: fmt.Sprintf("gw-%d", tok)})
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 2
		}
		ch := workers[dev]
		if ch == nil {
			ch = make(chan []byte, 16)
			workers[dev] = ch
			d := deviceFor(dev)
			wg.Go(func() {
				for raw := range ch {
					ack := s.Handle(dev, raw, d)
					fmt.Fprintf(os.Stdout, "ack %s %s %s\n", dev, ack.ID, ack.Verdict) // one write(2)
				}
			})
		}
		ch <- raw
	}
	for _, ch := range workers {
		close(ch)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	h.Close()
	return 0
}

// loadCmd is one command the test (playing the agent and its outbox) sends.
type loadCmd struct {
	dev, id  string
	tok, seq uint64
	want     fence.Verdict // Accepted for a new command, or Stale
	resent   bool          // sent again after a kill: a Duplicate is fine
	redeliv  bool          // a broker redelivery of an answered command: Duplicate, no terminal state
}

// loadDevice is the agent side of one device: the current holder's token
// and seq, and the one command in flight.
type loadDevice struct {
	tok, seq uint64
	created  int // commands created for it, not counting stale ones
	last     *loadCmd
	inflight *loadCmd
	mark     fence.Mark // of the last command created, not counting stale ones
}

// loadAgent drives the helper like an agent with a durable outbox: every
// command is recorded as created (history) before it is sent; its first ack
// is its terminal state; a command in flight when the helper is killed is
// sent again (same id) to the restarted helper until it is answered.
type loadAgent struct {
	t       *testing.T
	rng     *rand.Rand
	outbox  *history.Writer
	devs    map[string]*loadDevice
	n       int // ids issued
	sent    int
	stdin   io.Writer
	stopped bool // no new commands: finish what is in flight
}

// next picks dev's next command: mostly the holder's next seq, a new holder
// (token+1) every eight, now and then a frozen older holder (stale) or a
// broker redelivery of the last one (duplicate).
func (a *loadAgent) next(dev string) *loadCmd {
	d := a.devs[dev]
	a.n++
	switch r := a.rng.IntN(12); {
	case r == 0 && d.last != nil:
		c := *d.last
		c.want, c.resent, c.redeliv = fence.Duplicate, false, true
		return &c // not created again: it is the same command
	case r == 1 && d.tok > 100:
		c := &loadCmd{dev: dev, id: fmt.Sprintf("s%d", a.n), tok: d.tok - 1, seq: 1000 + uint64(a.n), want: fence.Stale}
		a.create(c)
		return c
	}
	if d.tok == 0 || d.seq == 8 {
		d.tok, d.seq = max(d.tok+1, 100), 0
	}
	d.seq++
	c := &loadCmd{dev: dev, id: fmt.Sprintf("c%d", a.n), tok: d.tok, seq: d.seq, want: fence.Accepted}
	d.created++
	d.mark = fence.Mark{Token: fence.Token(c.tok), Seq: c.seq}
	a.create(c)
	return c
}

func (a *loadAgent) create(c *loadCmd) {
	if err := a.outbox.Record(history.Event{Op: history.OpCreated, Device: c.dev, ID: c.id, Token: c.tok, Seq: c.seq}); err != nil {
		a.t.Fatal(err)
	}
}

// send puts dev's command in flight: the one a kill interrupted, else a new
// one (unless stopped).
func (a *loadAgent) send(dev string) {
	d := a.devs[dev]
	if d.inflight == nil {
		if a.stopped {
			return
		}
		d.inflight = a.next(dev)
	}
	c := d.inflight
	a.sent++
	fmt.Fprintf(a.stdin, "%s %d %d %s\n", c.dev, c.tok, c.seq, c.id) // fails once the helper is dead: resent later
}

// acked handles "ack dev id verdict" from the helper and returns dev.
func (a *loadAgent) acked(line string) string {
	var dev, id, v string
	if _, err := fmt.Sscanf(line, "ack %s %s %s", &dev, &id, &v); err != nil {
		a.t.Fatalf("helper said %q", line)
	}
	d := a.devs[dev]
	c := d.inflight
	if c == nil || c.id != id {
		a.t.Fatalf("ack %q, in flight %+v", line, c)
	}
	d.inflight = nil
	ok := v == c.want.String() || c.resent && c.want == fence.Accepted && v == fence.Duplicate.String()
	if !ok {
		a.t.Errorf("%s %s %d/%d: %s, want %v (resent %v)", dev, id, c.tok, c.seq, v, c.want, c.resent)
	}
	if c.redeliv {
		return dev // the command's terminal state is recorded already
	}
	if err := a.outbox.Record(history.Event{Op: history.OpTerminal, Device: dev, ID: id, Token: c.tok, Seq: c.seq, Verdict: v}); err != nil {
		a.t.Fatal(err)
	}
	if c.want == fence.Accepted {
		d.last = c
	}
	return dev
}

// round starts the helper, keeps one command in flight per device, and
// kills the helper with SIGKILL d after its first ack; with kill false it
// stops sending new commands, finishes those in flight and lets the helper
// exit.
func (a *loadAgent) round(dir string, kill bool, d time.Duration) {
	t := a.t
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), historyHelperEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	a.stdin, a.stopped = stdin, !kill
	for _, dev := range loadDevices {
		if c := a.devs[dev].inflight; c != nil {
			if c.redeliv {
				a.devs[dev].inflight = nil // a redelivery cut off: forget it
			} else {
				c.resent = true
			}
		}
		a.send(dev)
	}
	idle := func() bool {
		for _, dev := range loadDevices {
			if a.devs[dev].inflight != nil {
				return false
			}
		}
		return true
	}
	if !kill && idle() {
		stdin.Close()
	}
	var timer <-chan time.Time
	first, killed := true, false
	safety := time.After(30 * time.Second)
loop:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break loop
			}
			dev := a.acked(l)
			if first && kill {
				first, timer = false, time.After(d)
			}
			if !killed {
				a.send(dev)
			}
			if !kill && idle() {
				stdin.Close()
			}
		case <-timer:
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed, timer = true, nil
		case <-safety:
			cmd.Process.Kill()
			t.Fatal("helper round did not end")
		}
	}
	err = cmd.Wait()
	switch {
	case kill && err == nil:
		t.Fatal("helper exited cleanly; it was meant to be killed")
	case !kill && err != nil:
		t.Fatalf("helper: %v", err)
	}
}

// TestKill9History kills a process deciding commands for four devices
// through a shim with a history, at random moments under load, many times,
// while the test plays the agent with its outbox history (created before
// sending, first ack as terminal state, resend of the command in flight
// after each restart). The shim's history and the outbox's must check
// clean together, with no command lost, and the TxApplier devices must
// have applied every command exactly once. Kills that land between an
// accept's history line and its commit are what the shim's OpOpened events
// are for: without them the same history shows those commands applied
// twice.
func TestKill9History(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	opath := filepath.Join(dir, "outbox.jsonl")
	outbox := createHistory(t, opath, "outbox")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	a := &loadAgent{t: t, rng: rand.New(rand.NewPCG(seed, 9)), outbox: outbox, devs: map[string]*loadDevice{}}
	for _, dev := range loadDevices {
		a.devs[dev] = &loadDevice{}
	}
	const rounds = 60
	start := time.Now()
	for range rounds {
		a.round(dir, true, time.Duration(a.rng.IntN(40_000))*time.Microsecond)
		if t.Failed() {
			t.FailNow()
		}
	}
	a.round(dir, false, 0)
	elapsed := time.Since(start)

	evs, err := history.Read(filepath.Join(dir, "shim.jsonl"), opath)
	if err != nil {
		t.Fatal(err)
	}
	r := history.Check(evs)
	if !r.OK() {
		t.Fatalf("check:\n%s", r)
	}
	terminals := 0
	for _, n := range r.Terminal {
		terminals += n
	}
	if r.Created != terminals || r.Created == 0 || r.Devices != len(loadDevices) {
		t.Fatalf("created %d, terminal %d:\n%s", r.Created, terminals, r)
	}

	// Exactly once: every command created (not stale) took effect once.
	s := open(t, filepath.Join(dir, "fence.db"), nil)
	for _, dev := range loadDevices {
		d := a.devs[dev]
		if m := mark(t, s, dev); m != d.mark {
			t.Errorf("%s: mark %v, want %v", dev, m, d.mark)
		}
		if _, ok := deviceFor(dev).(counter); !ok {
			continue
		}
		if st := counterOf(t, s, dev); st.n != uint64(d.created) || st.last != d.mark {
			t.Errorf("%s: %d effects ending at %v, want %d ending at %v", dev, st.n, st.last, d.created, d.mark)
		}
	}

	// The OpOpened events are what makes the history exact: each one
	// discards at least one accept, and without them the checker would see
	// those commands applied twice.
	var opened int
	var without []history.Event
	for _, e := range evs {
		if e.Op == history.OpOpened && e.Device != "" {
			opened++
			continue
		}
		without = append(without, e)
	}
	old := history.Check(without)
	if opened > r.Uncommitted || (r.Uncommitted > 0) != (opened > 0) || (r.Uncommitted > 0) == old.OK() {
		t.Fatalf("%d OpOpened events, %d accepts discarded; without the events:\n%s", opened, r.Uncommitted, old)
	}
	t.Logf("%d kills in %v, %d commands sent; %d accepts recorded but never committed (%d OpOpened events; %d violations without them)\n%s",
		rounds, elapsed.Round(time.Millisecond), a.sent, r.Uncommitted, opened, len(old.Violations), r)
}
