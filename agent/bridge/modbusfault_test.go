package bridge

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// The faults at the gateway fence, on pymodbus behind the RS-485
// line simulator (internal/sandbox.RS485) or on 127.0.0.1: bit errors on
// the line, a foreign unit answering, exceptions, the slave restarted
// mid-transaction, the USB-RS485 adapter unplugged and replugged, the
// bridge killed around the wire. The slave's write log
// (modbustest.Options.WriteLog) is the witness: no write applied twice
// unless it is idempotent (the same absolute value again), every command
// ends with a verdict that matches what the slave did — Accepted, Invalid
// (nothing applied) or Unknown (perhaps applied) — and nothing is lost
// silently.

const (
	faultUnit = 2     // the hvac controller's unit
	faultBaud = 19200 // the line's rate
)

// hvacUnpolled is the hvac controller's profile with every poll off, so
// that the commands' frames are the only traffic on the line and a
// FlipBits corrupts the frame the test means.
func hvacUnpolled() (*profile.Profile, error) {
	path := filepath.Join("..", "..", "configs", "profiles", "hvac-controller.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = regexp.MustCompile(`poll_interval: \S+`).ReplaceAll(b, []byte("poll_interval: never"))
	p, err := profile.Parse(b, path)
	if err == nil && len(p.PollBlocks()) > 0 {
		err = fmt.Errorf("%s: still polled: %v", path, p.PollBlocks())
	}
	return p, err
}

// faultRigConfig describes a faultRig; the zero value is an RTU line at
// 19,200 baud, a 300 ms transaction timeout, 2 retries and a 10 s command
// timeout.
type faultRigConfig struct {
	Slave          modbustest.Options // Units, Baud and WriteLog are set by the rig
	TCP            bool               // the slave on 127.0.0.1 rather than on the line
	Timeout        time.Duration      // the bus's transaction timeout
	CommandTimeout time.Duration
	Raw            bool // also unit 3 of the same slave as device plc-3, without a profile
}

// faultRig is the hvac controller tc-2 (unit 2, unpolled) behind the
// bridge, on a pymodbus slave with a write log.
type faultRig struct {
	*mbRig
	line  *sandbox.RS485 // nil on TCP
	slave *modbustest.Server
	tbl   *fence.Table
	seq   uint64 // the last seq sent to tc-2, token 4
}

func startFaultRig(t *testing.T, c faultRigConfig) *faultRig {
	t.Helper()
	modbustest.Require(t)
	if c.Timeout == 0 {
		c.Timeout = 300 * time.Millisecond
	}
	c.Slave.Units, c.Slave.Baud, c.Slave.WriteLog = []byte{faultUnit}, faultBaud, true
	if c.Raw {
		c.Slave.Units = append(c.Slave.Units, 3)
	}
	r := &faultRig{}
	bus := Bus{BusConfig: modbus.BusConfig{Name: "rs485-1", Timeout: c.Timeout}, Retries: 2}
	if c.TCP {
		r.slave = modbustest.StartTCP(t, c.Slave)
		bus.TCP = r.slave.Addr()
	} else {
		r.line = startLine(t, 1)
		r.slave = modbustest.StartRTU(t, r.line.Drops[0], c.Slave)
		bus.RTU = &serial.PortConfig{Path: r.line.Master, Baud: faultBaud}
	}
	prof, err := hvacUnpolled()
	if err != nil {
		t.Fatal(err)
	}
	r.tbl, err = fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	devs := []Device{{ID: "tc-2", Modbus: &ModbusUnit{Bus: bus.Name, Unit: faultUnit, Profile: prof}}}
	if c.Raw {
		devs = append(devs, Device{ID: "plc-3", Modbus: &ModbusUnit{Bus: bus.Name, Unit: 3}})
	}
	r.mbRig = startMbRigWith(t, Config{Table: r.tbl, Buses: []Bus{bus}, Devices: devs, CommandTimeout: c.CommandTimeout})
	return r
}

// startLine starts an RS-485 line at faultBaud with drops drops.
func startLine(t *testing.T, drops int) *sandbox.RS485 {
	t.Helper()
	l, err := sandbox.NewRS485(sandbox.RS485Config{Baud: faultBaud, Drops: drops, Dir: t.TempDir(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// at returns the rig for subtest t: its failures are t's.
func (r *faultRig) at(t *testing.T) *faultRig {
	m, c := *r.mbRig, *r
	m.t, c.mbRig = t, &m
	return &c
}

// next returns the envelope of tc-2's next command.
func (r *faultRig) next(kind string, body []byte) *fence.Envelope {
	r.seq++
	return &fence.Envelope{V: fence.Version, Device: "tc-2", Token: 4, Seq: r.seq, Holder: "gw",
		ID: fmt.Sprintf("tc-2-4-%d", r.seq), Kind: kind, Body: body}
}

func (r *faultRig) setpointEnv(v float64) *fence.Envelope {
	return r.next(KindTwinSet, twinSet(r.t, map[string]any{"setpoint": v}))
}

// setpoint sets tc-2's setpoint (an absolute register write: idempotent,
// verified) and returns the ack.
func (r *faultRig) setpoint(v float64) *fence.Ack { return <-r.sendAsync(r.setpointEnv(v)) }

// ackAlarm sends tc-2's ack_alarm (a pulse on coil 8: not idempotent).
func (r *faultRig) ackAlarm() *fence.Ack { return <-r.sendAsync(r.next("ack_alarm", nil)) }

// sendAsync sends env and delivers its ack; a send that gets none within a
// minute fails the test (a command lost silently).
func (r *faultRig) sendAsync(env *fence.Envelope) <-chan *fence.Ack {
	ch := make(chan *fence.Ack, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		a, err := r.cmdr.Send(ctx, env)
		if err != nil {
			r.t.Errorf("%s: no verdict: %v", env.ID, err)
			a = &fence.Ack{Verdict: fence.Verdict(255), Reason: err.Error()}
		}
		ch <- a
	}()
	return ch
}

// writes returns the values the slave applied at unit 2's table addr.
func (r *faultRig) writes(table modbustest.Table, addr uint16) [][]uint16 {
	return modbustest.WritesTo(r.slave.Writes(r.t), faultUnit, table, addr)
}

// awaitWrites waits until the slave applied n writes at table addr.
func (r *faultRig) awaitWrites(table modbustest.Table, addr uint16, n int) {
	r.t.Helper()
	eventually(r.t, fmt.Sprintf("%d writes at %s %d (so far %+v)", n, table, addr, r.slave.Writes(r.t)), func() bool { return len(r.writes(table, addr)) >= n })
}

func (r *faultRig) stats() modbus.BusStats { return r.br.Buses()[0].Stats }

// count returns how many of ws are exactly v.
func count(ws [][]uint16, v ...uint16) int {
	n := 0
	for _, w := range ws {
		if slices.Equal(w, v) {
			n++
		}
	}
	return n
}

// eventually polls cond for up to 30 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantAck(t testing.TB, what string, a *fence.Ack, v fence.Verdict, reason string) {
	t.Helper()
	if a.Verdict != v || !strings.Contains(a.Reason, reason) {
		t.Errorf("%s: %v %q, want %v with %q", what, a.Verdict, a.Reason, v, reason)
	}
}

// Bit errors on the line. A corrupted answer to an idempotent write (the
// setpoint, an absolute value) is a lost answer: the write is sent again
// and accepted, and the slave applied the same value twice. A corrupted
// answer to the alarm pulse (not idempotent) ends Unknown, and the slave
// applied it once: it was never sent again. A corrupted request is dropped
// by the slave (its CRC fails), the bus times out, the setpoint is sent
// again and applied once; the pulse ends Unknown, not applied and not sent
// again (the master cannot tell a lost request from a lost answer).
func TestModbusBitErrors(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{})
	wantAck(t, "first setpoint", r.setpoint(19), fence.Accepted, "")

	before := r.stats()
	must(t, r.line.FlipBits(1, sandbox.ToMaster))
	wantAck(t, "setpoint, answer corrupted", r.setpoint(21.5), fence.Accepted, "")
	st := r.stats()
	if n := count(r.writes(modbustest.HoldingRegisters, 0), 215); n != 2 {
		t.Errorf("setpoint 215 applied %d times, want 2 (the write, its retry: the same absolute value)", n)
	}
	if bad := st.CRCErrors + st.FrameErrors - before.CRCErrors - before.FrameErrors; bad != 1 || r.line.Stats().Flipped != 1 {
		t.Errorf("%d bad answers counted, %d frames flipped; want 1 and 1", bad, r.line.Stats().Flipped)
	}

	must(t, r.line.FlipBits(1, sandbox.ToMaster))
	wantAck(t, "pulse, answer corrupted", r.ackAlarm(), fence.Unknown, "not idempotent")
	if n := len(r.writes(modbustest.Coils, 8)); n != 1 {
		t.Errorf("pulse applied %d times, want 1", n)
	}

	before = r.stats()
	must(t, r.line.FlipBits(1, sandbox.ToDrops))
	wantAck(t, "setpoint, request corrupted", r.setpoint(23), fence.Accepted, "")
	if n := count(r.writes(modbustest.HoldingRegisters, 0), 230); n != 1 {
		t.Errorf("setpoint 230 applied %d times, want 1 (the corrupted request was dropped)", n)
	}
	if to := r.stats().Timeouts - before.Timeouts; to < 1 {
		t.Errorf("%d timeouts, want the corrupted request's", to)
	}

	before = r.stats()
	must(t, r.line.FlipBits(1, sandbox.ToDrops))
	wantAck(t, "pulse, request corrupted", r.ackAlarm(), fence.Unknown, "not idempotent")
	if n := len(r.writes(modbustest.Coils, 8)); n != 1 {
		t.Errorf("pulse applied %d times in all, want 1 (the corrupted one never)", n)
	}
	if tx := r.stats().Transactions - before.Transactions; tx != 1 {
		t.Errorf("pulse sent %d times, want 1", tx)
	}
	if r.line.Stats().Flipped != 4 {
		t.Errorf("line flipped %d frames, want 4", r.line.Stats().Flipped)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A foreign unit answering: the slave serves unit 2's requests but its
// answers say unit 3. The bus counts each as a frame error and takes none
// as unit 2's answer. The setpoint is sent again up to the retries, applied
// each time (the same value), and ends Unknown; the pulse is sent once,
// applied once, and ends Unknown.
func TestModbusForeignUnitAnswers(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{Slave: modbustest.Options{AnswerAs: map[byte]byte{faultUnit: 3}}})
	before := r.stats()
	wantAck(t, "setpoint", r.setpoint(21.5), fence.Unknown, "no answer after 3 attempts")
	if ws := r.writes(modbustest.HoldingRegisters, 0); len(ws) != 3 || count(ws, 215) != 3 {
		t.Errorf("setpoint writes %v, want 215 three times (1 + 2 retries)", ws)
	}
	if fe := r.stats().FrameErrors - before.FrameErrors; fe != 3 {
		t.Errorf("%d frame errors, want 3", fe)
	}
	before = r.stats()
	wantAck(t, "pulse", r.ackAlarm(), fence.Unknown, "not idempotent")
	if n := len(r.writes(modbustest.Coils, 8)); n != 1 {
		t.Errorf("pulse applied %d times, want 1", n)
	}
	if fe := r.stats().FrameErrors - before.FrameErrors; fe != 1 {
		t.Errorf("%d frame errors, want 1", fe)
	}
	if u := r.br.Units(); !strings.Contains(u[0].LastError, "answer from unit 3") {
		t.Errorf("tc-2's last error %q does not name the foreign unit", u[0].LastError)
	}
}

// Exception answers. "Slave device busy" applies nothing, so even the
// pulse is asked again, and applied once; "illegal data address" is
// Invalid, named, not sent again, and applied nothing.
func TestModbusExceptionAnswers(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{Slave: modbustest.Options{Busy: 1}, Raw: true})
	before := r.stats()
	wantAck(t, "pulse answered busy", r.ackAlarm(), fence.Accepted, "")
	st := r.stats()
	if n := len(r.writes(modbustest.Coils, 8)); n != 1 || st.Exceptions-before.Exceptions != 1 || st.Transactions-before.Transactions != 2 {
		t.Errorf("pulse applied %d times, %d exceptions in %d transactions; want 1, 1, 2",
			n, st.Exceptions-before.Exceptions, st.Transactions-before.Transactions)
	}
	before = st
	a := r.send("plc-3", 4, 1, modbus.KindWriteRegister, rawWrite(t, 500, 1))
	wantAck(t, "write beyond the block", a, fence.Invalid, "illegal data address")
	st = r.stats()
	if st.Transactions-before.Transactions != 1 || st.Exceptions-before.Exceptions != 1 {
		t.Errorf("illegal address: %d transactions, %d exceptions; want 1, 1", st.Transactions-before.Transactions, st.Exceptions-before.Exceptions)
	}
	for _, w := range r.slave.Writes(t) {
		if w.Unit == 3 {
			t.Errorf("unit 3 applied %+v", w)
		}
	}
}

// The slave killed mid-transaction (it applied the write and had not
// answered yet) and restarted, with its registers back to their initial
// values. The pulse ends Unknown and was applied once, by the killed
// slave. The setpoint is sent again to the restarted slave and accepted
// (verified by its read-back), or, if the restart outlasted the retries,
// ends Unknown; every write of it was the same value. The bus serves the
// restarted slave.
func TestModbusSlaveRestartMidTransaction(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		t.Run(map[bool]string{false: "rtu", true: "tcp"}[tcp], func(t *testing.T) {
			// RTU: a 2 s timeout, so that the restart usually completes
			// before the setpoint's retries run out. TCP: the connection
			// breaks at the kill, and the retry waits for the redial.
			r := startFaultRig(t, faultRigConfig{TCP: tcp, Timeout: 2 * time.Second, CommandTimeout: 30 * time.Second})
			restart := func(env *fence.Envelope, table modbustest.Table, addr uint16) *fence.Ack {
				t.Helper()
				r.slave.Stall(t, true)
				ch := r.sendAsync(env)
				r.awaitWrites(table, addr, len(r.writes(table, addr))+1)
				r.slave.Stop()
				r.slave.Stall(t, false)
				r.slave.Restart(t)
				return <-ch
			}
			wantAck(t, "pulse", restart(r.next("ack_alarm", nil), modbustest.Coils, 8), fence.Unknown, "not idempotent")
			ws := r.slave.Writes(t)
			if n := len(modbustest.WritesTo(ws, faultUnit, modbustest.Coils, 8)); n != 1 || len(ws) != 1 {
				t.Errorf("pulse applied %d times, want 1: %+v", n, ws)
			}
			first := ws[0].PID
			a := restart(r.setpointEnv(21.5), modbustest.HoldingRegisters, 0)
			ws = r.slave.Writes(t)
			sp := modbustest.WritesTo(ws, faultUnit, modbustest.HoldingRegisters, 0)
			switch {
			case count(sp, 215) != len(sp):
				t.Errorf("setpoint writes %v: not all 215", sp)
			case a.Verdict == fence.Accepted:
				if last := ws[len(ws)-1]; last.PID == first || count(sp, 215) < 2 {
					t.Errorf("setpoint accepted, but not written to the restarted slave: %+v", ws)
				}
			case tcp || a.Verdict != fence.Unknown || !strings.Contains(a.Reason, "no answer after 3 attempts"):
				t.Errorf("setpoint: %v %q", a.Verdict, a.Reason)
			default:
				t.Logf("the restart outlasted the retries: %q", a.Reason)
			}
			wantAck(t, "after the restart", r.setpoint(22), fence.Accepted, "")
		})
	}
}

// The USB-RS485 adapter unplugged and replugged. Commands sent while it is
// out are not lost: they wait (not sent, sent again until the command
// timeout) and land after the replug, each applied once, the pulse too.
func TestModbusAdapterUnplugged(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{CommandTimeout: 30 * time.Second})
	wantAck(t, "before", r.setpoint(19), fence.Accepted, "")
	must(t, r.line.Unplug())
	before := r.stats()
	sp := r.sendAsync(r.setpointEnv(21.5))
	eventually(t, "the setpoint not sent", func() bool { return r.stats().NotSent > before.NotSent })
	pulse := r.next("ack_alarm", nil)
	pa := r.sendAsync(pulse)
	eventually(t, "the pulse admitted", func() bool {
		rec, _, err := r.tbl.Get("tc-2")
		return err == nil && rec.Mark.Seq == pulse.Seq
	})
	must(t, r.line.Replug())
	wantAck(t, "setpoint sent while unplugged", <-sp, fence.Accepted, "")
	wantAck(t, "pulse sent while unplugged", <-pa, fence.Accepted, "")
	if n, m := count(r.writes(modbustest.HoldingRegisters, 0), 215), len(r.writes(modbustest.Coils, 8)); n != 1 || m != 1 {
		t.Errorf("setpoint applied %d times, pulse %d; want 1 and 1", n, m)
	}
}

// The adapter out for longer than the command timeout: a command never
// sent ends Invalid, "not done", and applied nothing. One whose request
// went out (the slave applied it) and whose answer the unplug lost ends
// Unknown, though its retries were never sent: its first attempt may have
// been applied, as it was. After the replug the bus serves again.
func TestModbusAdapterOutPastTheTimeout(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{CommandTimeout: 2 * time.Second})
	wantAck(t, "before", r.setpoint(19), fence.Accepted, "")
	must(t, r.line.Unplug())
	wantAck(t, "sent while unplugged", r.setpoint(23), fence.Invalid, "not done")
	if n := count(r.writes(modbustest.HoldingRegisters, 0), 230); n != 0 {
		t.Errorf("a command never sent was applied %d times", n)
	}
	must(t, r.line.Replug())
	r.servedAgain()

	r.slave.Stall(t, true)
	ch := r.sendAsync(r.setpointEnv(24))
	r.awaitWrites(modbustest.HoldingRegisters, 0, len(r.writes(modbustest.HoldingRegisters, 0))+1)
	must(t, r.line.Unplug())
	r.slave.Stall(t, false)
	wantAck(t, "unplugged mid-transaction", <-ch, fence.Unknown, "fate unknown")
	if n := count(r.writes(modbustest.HoldingRegisters, 0), 240); n != 1 {
		t.Errorf("setpoint 240 applied %d times, want 1", n)
	}
	must(t, r.line.Replug())
	r.servedAgain()
}

// servedAgain sends setpoints until one is accepted: after a replug the
// port reopens within its backoff (transport/serial.Conn, up to 5 s),
// which may outlast a short command timeout. Each one refused must be
// "not done", and none applied.
func (r *faultRig) servedAgain() {
	r.t.Helper()
	before := count(r.writes(modbustest.HoldingRegisters, 0), 200)
	for deadline := time.Now().Add(30 * time.Second); ; {
		a := r.setpoint(20)
		if a.Verdict == fence.Accepted {
			if n := count(r.writes(modbustest.HoldingRegisters, 0), 200) - before; n != 1 {
				r.t.Errorf("after the replug: setpoint 200 applied %d times, want once (the accepted one)", n)
			}
			return
		}
		if a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "not done") || time.Now().After(deadline) {
			r.t.Fatalf("after the replug: %v %q", a.Verdict, a.Reason)
		}
	}
}

// The command's timeout ends while the bus still waits for the answer to
// a write that went out (the unit is slow: its answer held). The slave
// applied it, so the command ends Unknown, not "not done", and it was not
// sent again.
func TestModbusCommandTimeoutCutsTheWait(t *testing.T) {
	r := startFaultRig(t, faultRigConfig{Timeout: 10 * time.Second, CommandTimeout: time.Second})
	r.slave.Stall(t, true)
	wantAck(t, "pulse", r.ackAlarm(), fence.Unknown, "fate unknown")
	r.slave.Stall(t, false)
	if n := len(r.writes(modbustest.Coils, 8)); n != 1 {
		t.Errorf("pulse applied %d times, want 1", n)
	}
}

// helperModbus is the Modbus device of TestBridgeHelperProcess's spec
// "id=modbus:PATH": the hvac controller (unpolled), unit 2 on an RTU bus
// at PATH.
func helperModbus(id, path string) (Device, Bus, error) {
	prof, err := hvacUnpolled()
	if err != nil {
		return Device{}, Bus{}, err
	}
	bus := Bus{BusConfig: modbus.BusConfig{Name: "rs485-" + id, RTU: &serial.PortConfig{Path: path, Baud: faultBaud},
		Timeout: 300 * time.Millisecond}, Retries: 2}
	return Device{ID: id, Modbus: &ModbusUnit{Bus: bus.Name, Unit: faultUnit, Profile: prof}}, bus, nil
}

// The bridge killed (SIGKILL) around the wire, its Modbus device's slave
// alive throughout. Killed after the admit and before the wire, the
// restarted bridge reads back the recovered command: the pulse is not
// found and ends Unknown, never written; the setpoint is not found and is
// written, once. Killed after the wire (the slave applied the command, its
// answer not yet read) and before the applied-mark, the read-back finds
// the command applied: it is not written again, pulse or setpoint.
func TestModbusCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("kills bridge processes")
	}
	r := startFaultRig(t, faultRigConfig{})
	r.stop() // the rig's bridge frees the line for the helper processes
	spec := r.broker.URL() + "|" + filepath.Join(t.TempDir(), "fence.db") + "|tc-2=modbus:" + r.line.Master
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "crash-holder", CleanStart: true},
		mqtt.Topics{Prefix: "kill"}, []string{"tc-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)
	if err := awaitSubscribed(cmdr); err != nil {
		t.Fatal(err)
	}
	send := func(env *fence.Envelope, timeout time.Duration) (*fence.Ack, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return cmdr.Send(ctx, env)
	}
	kill := func(child *exec.Cmd) {
		_ = child.Process.Kill()
		_ = child.Wait()
	}
	start := func(t *testing.T, env ...string) *exec.Cmd {
		child := helper(t, spec, env...)
		t.Cleanup(func() { kill(child) }) // also when t fails first
		return child
	}
	for _, c := range []struct {
		name    string
		env     *fence.Envelope
		table   modbustest.Table
		addr    uint16
		afterTx bool          // killed after the wire, else before it
		want    fence.Verdict // the resend's, after the restart (Accepted: or Duplicate)
		writes  int           // the slave applied it, in all
	}{
		{"before the wire, pulse", r.next("ack_alarm", nil), modbustest.Coils, 8, false, fence.Unknown, 0},
		{"before the wire, setpoint", r.setpointEnv(21.5), modbustest.HoldingRegisters, 0, false, fence.Accepted, 1},
		{"after the wire, pulse", r.next("ack_alarm", nil), modbustest.Coils, 8, true, fence.Accepted, 1},
		{"after the wire, setpoint", r.setpointEnv(22.5), modbustest.HoldingRegisters, 0, true, fence.Accepted, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := r.at(t)
			before := len(r.writes(c.table, c.addr))
			if c.afterTx {
				child := start(t)
				r.slave.Stall(t, true)
				sent := make(chan error, 1)
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					_, err := cmdr.Send(ctx, c.env)
					sent <- err
				}()
				r.awaitWrites(c.table, c.addr, before+1)
				kill(child)
				r.slave.Stall(t, false)
				cancel()
				if err := <-sent; err == nil {
					t.Fatal("answered, though the bridge was killed before the answer")
				}
			} else {
				child := start(t, crashEnv+"="+c.env.ID)
				if a, err := send(c.env, 2*time.Second); err == nil {
					t.Fatalf("the command the bridge died on was answered: %+v", a)
				}
				if err := child.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("helper did not die at the failpoint: %v", err)
				}
			}
			start(t)
			a, err := send(c.env, 30*time.Second)
			switch {
			case err != nil:
				t.Fatalf("resend: %v", err)
			case c.want == fence.Accepted && a.Verdict != fence.Accepted && a.Verdict != fence.Duplicate,
				c.want != fence.Accepted && a.Verdict != c.want:
				t.Errorf("resend: %v %q, want %v", a.Verdict, a.Reason, c.want)
			}
			if n := len(r.writes(c.table, c.addr)) - before; n != c.writes {
				t.Errorf("applied %d times, want %d", n, c.writes)
			}
		})
	}
}
