package bridge

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

const killEnv = "EDGEFENCE_BRIDGE_KILL_CHILD"

// TestBridgeHelperProcess is the bridge process of TestBridgeKill9: it runs
// only when re-executed by it.
func TestBridgeHelperProcess(t *testing.T) {
	spec := os.Getenv(killEnv)
	if spec == "" {
		t.Skip("helper process")
	}
	// spec: broker|table|dev=path,dev=path; path modbus:PATH is a Modbus
	// device on an RTU bus at PATH (helperModbus)
	parts := strings.Split(spec, "|")
	var devs []Device
	var buses []Bus
	for _, kv := range strings.Split(parts[2], ",") {
		id, path, _ := strings.Cut(kv, "=")
		if path, ok := strings.CutPrefix(path, "modbus:"); ok { // modbusfault_test.go
			d, b, err := helperModbus(id, path)
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			devs, buses = append(devs, d), append(buses, b)
			continue
		}
		devs = append(devs, Device{ID: id, Port: serial.PortConfig{Path: path}})
	}
	hist, err := helperHistory()
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	tbl, err := fence.OpenTable(parts[1], &fence.TableOptions{Timeout: 10 * time.Second, History: hist})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	cfg := Config{Table: tbl, Topics: mqtt.Topics{Prefix: "kill"}, Devices: devs, Buses: buses, History: hist}
	var br *Bridge
	if err := helperHooks(&cfg, &br); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	br, err = New(cfg)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	c, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{parts[0]}, ClientID: "kill-home",
		CleanStart: true, Subscriptions: br.Subscriptions()})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.AwaitSubscribed(ctx); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if err := br.Start(context.Background(), c); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute) // until killed
	os.Exit(3)
}

// TestBridgeKill9 kills the bridge process with SIGKILL at random moments
// while holders command its devices, many times: after every restart the
// fence table never regresses (every command acked accepted is at or below
// its device's stored mark), bbolt's consistency check is clean, and the
// devices never applied an older command after a newer one.
func TestBridgeKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("kill -9 loop; skipped with -short")
	}
	const rounds = 200 // ~10 s, ~25 s with the race detector
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	topics := mqtt.Topics{Prefix: "kill"}
	dir := t.TempDir()
	table := filepath.Join(dir, "fence.db")

	// Four devices on real ptys, alive across the bridge's deaths; each
	// register 0 holds the ordinal of the last command applied to it.
	ids := []string{"k1", "k2", "k3", "k4"}
	var specs []string
	applied := map[string]*syncBuffer{}
	for _, id := range ids {
		applied[id] = &syncBuffer{}
		specs = append(specs, id+"="+serveDevice(t, legacy.NewRegisters(id, 4, applied[id])))
	}
	spec := b.URL() + "|" + table + "|" + strings.Join(specs, ",")
	hist := filepath.Join(dir, "history.jsonl")

	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "kill-holder", CleanStart: true}, topics, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)

	type cmdState struct{ n uint64 } // per device: ordinal of the next command
	next := map[string]*cmdState{}
	for _, id := range ids {
		next[id] = &cmdState{}
	}
	mark := func(n uint64) (fence.Token, uint64) { return fence.Token(100 + n/5), n%5 + 1 } // a new token every 5
	acked := map[string]fence.Mark{}
	prev := map[string]fence.Mark{}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	start := time.Now()
	for round := range rounds {
		child := exec.Command(os.Args[0], "-test.run=^TestBridgeHelperProcess$")
		child.Env = append(os.Environ(), killEnv+"="+spec, historyEnv+"="+hist)
		out, err := child.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		ready := false
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready = true
				break
			}
			if strings.HasPrefix(sc.Text(), "error") {
				t.Fatalf("round %d: child: %s", round, sc.Text())
			}
		}
		if !ready {
			child.Wait()
			t.Fatalf("round %d: child exited before ready", round)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := next[id]
				for ctx.Err() == nil {
					n := st.n
					tok, seq := mark(n)
					body, _ := fence.EncodeBody(map[string]any{"addr": 0, "value": n % 60000})
					sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
					ack, err := cmdr.Send(sctx, &fence.Envelope{V: fence.Version, Device: id, Token: tok, Seq: seq,
						ID: fmt.Sprintf("%s-%d", id, n), Kind: modbus.KindWriteRegister, Body: body})
					scancel()
					if err != nil {
						return // the bridge died with the command in flight
					}
					switch ack.Verdict {
					case fence.Accepted:
						mu.Lock()
						acked[id] = fence.Mark{Token: tok, Seq: seq}
						mu.Unlock()
						st.n++
					case fence.Duplicate, fence.Invalid, fence.Unknown:
						// admitted before a kill, fate unknown or already
						// applied: move on to the next command
						st.n++
					default:
						t.Errorf("round %d %s: %+v", round, id, ack)
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(5+rng.IntN(60)) * time.Millisecond)
		child.Process.Signal(syscall.SIGKILL)
		child.Wait()
		cancel()
		wg.Wait()
		for _, id := range ids {
			next[id].n++ // never reuse a (token, seq) that may be in the table
		}

		db, err := bbolt.Open(table, 0o600, &bbolt.Options{Timeout: 10 * time.Second, ReadOnly: true})
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		err = db.View(func(tx *bbolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			return nil
		})
		db.Close()
		if err != nil {
			t.Fatalf("round %d: bbolt check: %v", round, err)
		}
		tbl, err := fence.OpenTable(table, &fence.TableOptions{ReadOnly: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, id := range ids {
			rec, _, err := tbl.Get(id)
			if err != nil {
				t.Fatalf("round %d %s: %v", round, id, err)
			}
			if less(rec.Mark, acked[id]) || less(rec.Mark, prev[id]) {
				t.Fatalf("round %d %s: stored mark %v below acked %v or previous %v", round, id, rec.Mark, acked[id], prev[id])
			}
			prev[id] = rec.Mark
		}
		tbl.Close()
	}
	total := 0
	for _, id := range ids {
		last := -1
		for _, a := range applied[id].applied(t) {
			if int(a.Values[0]) <= last {
				t.Fatalf("%s: applied %d after %d", id, a.Values[0], last)
			}
			last = int(a.Values[0])
			total++
		}
	}
	// The bridges' history: no command recorded applied twice (a
	// redelivery after a restart found the write already applied instead
	// of writing it again), and every write the devices applied recorded
	// once, but for a kill between the device applying a write and the
	// bridge reading its answer: at most one per device and kill, counted.
	// history.Read allows only torn lines a kill can leave (the last one,
	// or one sealed off by the next process's opened event); the checker
	// holds I1 at the fence table and flags a command applied twice.
	evs, err := history.Read(hist)
	if err != nil {
		t.Fatal(err)
	}
	if rep := history.CheckWith(evs, history.CheckOptions{}); !rep.OK() {
		t.Fatalf("bridge history: %v", rep.Violations)
	}
	appliedEvents := map[string]int{}
	for _, e := range evs {
		if e.Op == history.OpApplied {
			if appliedEvents[e.ID]++; appliedEvents[e.ID] > 1 {
				t.Fatalf("%s recorded applied twice", e.ID)
			}
		}
	}
	missing := 0
	for _, id := range ids {
		for _, a := range applied[id].applied(t) {
			if appliedEvents[fmt.Sprintf("%s-%d", id, a.Values[0])] != 1 {
				missing++
			}
		}
	}
	if missing > len(ids)*rounds {
		t.Fatalf("%d of %d applied writes have no OpApplied event", missing, total)
	}
	t.Logf("%d kill -9 rounds in %v; %d writes applied, in order, none twice; %d without an OpApplied event",
		rounds, time.Since(start).Round(time.Millisecond), total, missing)
}

func less(a, b fence.Mark) bool { return a.Token < b.Token || a.Token == b.Token && a.Seq < b.Seq }
