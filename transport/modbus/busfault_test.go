package modbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/transport/serial"
)

// eventually polls f until it returns nil, for at most testWait.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, testWait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readHolding(b *Bus, unit byte, addr uint16) error {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	r, err := b.Transact(ctx, unit, &Request{Func: FuncReadHolding, Addr: addr, Count: 1})
	if err != nil {
		return err
	}
	if want := modbustest.Initial(unit, addr); r.Values[0] != want {
		return fmt.Errorf("unit %d register %d: %d, want %d", unit, addr, r.Values[0], want)
	}
	return nil
}

// An absent unit costs its timeout and no more: the next transaction, to
// a unit that is there, on the same bus, works.
func TestBusAbsentUnit(t *testing.T) {
	f := newRTU(t, 19200, "N", 7)
	slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{7}, Size: blockSize})
	for name, cfg := range map[string]BusConfig{"rtu": {RTU: &f.port}, "tcp": {TCP: slave.Addr()}} {
		t.Run(name, func(t *testing.T) {
			b, _ := openTestBus(t, cfg)
			start := time.Now()
			err := readHolding(b, 9, 0)
			took := time.Since(start)
			if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrNotSent) {
				t.Fatalf("absent unit: %v", err)
			}
			if took < testTimeout*9/10 || took > testWait {
				t.Errorf("absent unit answered ErrTimeout after %v, timeout %v", took, testTimeout)
			}
			if err := readHolding(b, 7, 3); err != nil {
				t.Fatalf("present unit after an absent one: %v", err)
			}
			if st := b.Stats(); st.Timeouts != 1 || st.Transactions != 2 || st.Busy < testTimeout*9/10 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// Refusals before anything is queued, and a closed bus; no slave needed.
func TestBusRefusals(t *testing.T) {
	b, err := OpenBus(BusConfig{Name: "nowhere", TCP: "127.0.0.1:1", Timeout: testTimeout})
	if err == nil || b == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("absent endpoint: bus %v, %v (want a usable bus and why)", b, err)
	}
	ctx := context.Background()
	for name, c := range map[string]struct {
		unit byte
		q    Request
		want error
	}{
		"broadcast write": {0, Request{Func: FuncWriteSingle, Addr: 1, Values: []uint16{1}}, ErrBroadcast},
		"broadcast coils": {0, Request{Func: FuncWriteCoils, Addr: 1, Values: []uint16{1}}, ErrBroadcast},
		"unit 248":        {248, Request{Func: FuncReadHolding, Count: 1}, ErrFrame},
		"bad request":     {1, Request{Func: FuncReadHolding, Count: 200}, ErrPDU},
		"endpoint down":   {1, Request{Func: FuncReadHolding, Count: 1}, ErrNotSent},
	} {
		if _, err := b.Transact(ctx, c.unit, &c.q); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if st := b.Stats(); st.Transactions != 0 || st.NotSent != 1 {
		t.Errorf("stats %+v", st)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Transact(ctx, 1, &Request{Func: FuncReadHolding, Count: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	for name, cfg := range map[string]BusConfig{
		"neither":      {},
		"both":         {TCP: "127.0.0.1:502", RTU: &serial.PortConfig{Path: "/dev/null"}},
		"no port":      {TCP: "127.0.0.1"},
		"bad port":     {TCP: "127.0.0.1:70000"},
		"bad baud":     {RTU: &serial.PortConfig{Path: "/dev/ttyX", Baud: 12345}},
		"neg. timeout": {TCP: "127.0.0.1:502", Timeout: -1},
	} {
		if b, err := OpenBus(cfg); b != nil || !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v %v", name, b, err)
		}
	}
	missing := filepath.Join(t.TempDir(), "ttyUSB9")
	b, err = OpenBus(BusConfig{RTU: &serial.PortConfig{Path: missing}})
	if b == nil || !errors.Is(err, serial.ErrPortMissing) {
		t.Fatalf("missing port: %v %v", b, err)
	}
	defer b.Close()
	if _, err := b.Transact(ctx, 1, &Request{Func: FuncReadHolding, Count: 1}); !errors.Is(err, ErrNotSent) {
		t.Errorf("missing port: %v", err)
	}
}

// A transaction whose context ends while it waits behind another is never
// sent; one whose context ends after sending is of unknown fate.
func TestBusCancelledWhileQueued(t *testing.T) {
	slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{1}, Size: blockSize})
	b, _ := openTestBus(t, BusConfig{TCP: slave.Addr(), Timeout: 2 * time.Second})
	held := make(chan error, 1)
	go func() { held <- readHolding(b, 9, 0) }() // an absent unit holds the bus for its timeout
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := b.Transact(ctx, 1, &Request{Func: FuncReadHolding, Count: 1})
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued past its deadline: %v", err)
	}
	if err := <-held; !errors.Is(err, ErrTimeout) {
		t.Fatalf("the holder: %v", err)
	}
	// Cancelled after sending: fate unknown, and the bus does not wait out
	// its timeout for it.
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := b.Transact(ctx, 9, &Request{Func: FuncWriteSingle, Addr: 1, Values: []uint16{1}}); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled after sending: %v", err)
	}
	if took := time.Since(start); took >= 2*time.Second {
		t.Errorf("a cancelled transaction held its caller %v, the bus's whole timeout", took)
	}
	if st := b.Stats(); st.Transactions != 2 || st.NotSent != 1 || st.Timeouts != 2 {
		t.Errorf("stats %+v", st)
	}
}

// The slave killed mid-run and restarted: RTU sees silence (ErrTimeout),
// TCP a lost connection (ErrTimeout or ErrNotSent); both recover.
func TestBusSlaveRestart(t *testing.T) {
	f := newRTU(t, 19200, "N", 7)
	tcp := modbustest.StartTCP(t, modbustest.Options{Units: []byte{7}, Size: blockSize})
	for name, c := range map[string]struct {
		cfg   BusConfig
		slave *modbustest.Server
	}{"rtu": {BusConfig{RTU: &f.port}, f.slave}, "tcp": {BusConfig{TCP: tcp.Addr()}, tcp}} {
		t.Run(name, func(t *testing.T) {
			b, logs := openTestBus(t, c.cfg)
			if err := readHolding(b, 7, 1); err != nil {
				t.Fatal(err)
			}
			c.slave.Stop()
			err := readHolding(b, 7, 1)
			if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrNotSent) {
				t.Fatalf("slave dead: %v", err)
			}
			c.slave.Restart(t)
			eventually(t, "recovery", func() error { return readHolding(b, 7, 1) })
			st := b.Stats()
			if st.Timeouts+st.NotSent == 0 {
				t.Errorf("stats %+v", st)
			}
			if c.cfg.TCP != "" && (!strings.Contains(logs.String(), "modbus connection lost") || !strings.Contains(logs.String(), "modbus connection open")) {
				t.Errorf("no loss and recovery in the log:\n%s", logs)
			}
		})
	}
}

// Several callers on one bus: each gets the answer to its own request
// (the registers differ per unit and address), on RTU and TCP.
func TestBusConcurrentCallers(t *testing.T) {
	units := []byte{1, 2, 3}
	f := newRTU(t, 19200, "N", units...)
	tcp := modbustest.StartTCP(t, modbustest.Options{Units: units, Size: blockSize})
	for name, cfg := range map[string]BusConfig{"rtu": {RTU: &f.port}, "tcp": {TCP: tcp.Addr()}} {
		t.Run(name, func(t *testing.T) {
			b, _ := openTestBus(t, cfg)
			const callers, each = 8, 15
			var wg sync.WaitGroup
			errs := make(chan error, callers*each)
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(c), 1))
					for range each {
						unit := units[rng.IntN(len(units))]
						if rng.IntN(3) == 0 { // a write of this caller's own register, read back
							addr, v := uint16(40+c), uint16(rng.IntN(65536))
							if _, err := b.Transact(context.Background(), unit, &Request{Func: FuncWriteSingle, Addr: addr, Values: []uint16{v}}); err != nil {
								errs <- err
								continue
							}
							r, err := b.Transact(context.Background(), unit, &Request{Func: FuncReadHolding, Addr: addr, Count: 1})
							if err == nil && r.Values[0] != v {
								err = fmt.Errorf("caller %d unit %d: wrote %d, read %d", c, unit, v, r.Values[0])
							}
							if err != nil {
								errs <- err
							}
							continue
						}
						if err := readHolding(b, unit, uint16(rng.IntN(40))); err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if st := b.Stats(); st.Timeouts != 0 || st.CRCErrors+st.FrameErrors != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// fakeSlave opens one end of a fresh pty pair as a device and returns it
// with the path of the other end, for the bus.
func fakeSlave(t *testing.T) (*serial.Port, string) {
	t.Helper()
	pair := modbustest.NewPtyPair(t)
	dev, err := serial.OpenPort(serial.PortConfig{Path: pair.A, Baud: 19200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev, pair.B
}

// readRequest reads one 8-byte request frame (a read) from dev and returns
// when its first byte came.
func readRequest(dev *serial.Port) (time.Time, error) {
	buf, n := make([]byte, 8), 0
	var first time.Time
	for n < len(buf) {
		k, err := dev.Read(buf[n:])
		if err != nil && !errors.Is(err, serial.ErrReadTimeout) {
			return first, err
		}
		if k > 0 && n == 0 {
			first = time.Now()
		}
		n += k
	}
	return first, nil
}

// Bad answers on an RTU line, from a fake slave on a pty pair (a unit test
// of the framing, not a protocol peer): a CRC error, another unit's
// answer, a foreign function code, each followed by more garbage. Each is
// counted, fails its transaction with ErrTimeout (fate unknown), and the
// line is drained before the next request, which works.
func TestBusRTUBadFrames(t *testing.T) {
	dev, path := fakeSlave(t)
	good := func() []byte {
		f, _ := EncodeRTU(7, []byte{0x03, 0x02, 0x12, 0x34})
		return f
	}
	answers := []func() []byte{
		func() []byte { f := good(); f[3] ^= 0x10; return append(f, 0xAA, 0x55, 0x00) }, // bit error, then noise
		func() []byte { f, _ := EncodeRTU(8, []byte{0x03, 0x02, 0, 1}); return append(f, 1, 2, 3) },
		func() []byte { f, _ := EncodeRTU(7, []byte{0x04, 0x02, 0, 1}); return f },
		good,
	}
	served := make(chan error, 1)
	go func() {
		for _, answer := range answers {
			if _, err := readRequest(dev); err != nil {
				served <- err
				return
			}
			if _, err := dev.Write(answer()); err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()
	b, _ := openTestBus(t, BusConfig{RTU: &serial.PortConfig{Path: path, Baud: 19200}})
	q := &Request{Func: FuncReadHolding, Addr: 0, Count: 1}
	for i, want := range []error{ErrCRC, ErrFrame, ErrFrame} {
		if _, err := b.Transact(context.Background(), 7, q); !errors.Is(err, want) || !errors.Is(err, ErrTimeout) {
			t.Fatalf("bad answer %d: %v, want %v and ErrTimeout", i, err, want)
		}
	}
	r, err := b.Transact(context.Background(), 7, q)
	if err != nil || r.Values[0] != 0x1234 {
		t.Fatalf("good answer after bad ones: %+v %v", r, err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.CRCErrors != 1 || st.FrameErrors != 2 || st.Timeouts != 3 || st.Transactions != 4 {
		t.Errorf("stats %+v", st)
	}
}

// After a bad answer the bus drains the line until it is quiet: a slave
// that keeps babbling after a corrupt frame (a byte every 10 ms, 200 ms in
// all) holds the next request back until it stops. Without the drain the
// request would go out into the babble.
func TestBusRTUDrainsAfterBadFrame(t *testing.T) {
	dev, path := fakeSlave(t)
	type timing struct {
		babbleEnd, next time.Time
		err             error
	}
	done := make(chan timing, 1)
	go func() {
		var tm timing
		defer func() { done <- tm }()
		if _, tm.err = readRequest(dev); tm.err != nil {
			return
		}
		bad, _ := EncodeRTU(7, []byte{0x03, 0x02, 0x12, 0x34})
		bad[4] ^= 1
		if _, tm.err = dev.Write(bad); tm.err != nil {
			return
		}
		for range 20 {
			time.Sleep(10 * time.Millisecond)
			tm.babbleEnd = time.Now()
			if _, tm.err = dev.Write([]byte{0x55}); tm.err != nil {
				return
			}
		}
		if tm.next, tm.err = readRequest(dev); tm.err != nil {
			return
		}
		good, _ := EncodeRTU(7, []byte{0x03, 0x02, 0x12, 0x34})
		_, tm.err = dev.Write(good)
	}()
	b, _ := openTestBus(t, BusConfig{RTU: &serial.PortConfig{Path: path, Baud: 19200}})
	b.line.(*rtuLine).drainQuiet = 300 * time.Millisecond // 30 times the babble's gaps: a slow machine keeps up
	q := &Request{Func: FuncReadHolding, Addr: 0, Count: 1}
	if _, err := b.Transact(context.Background(), 7, q); !errors.Is(err, ErrCRC) {
		t.Fatalf("corrupt answer: %v", err)
	}
	r, err := b.Transact(context.Background(), 7, q)
	if err != nil || r.Values[0] != 0x1234 {
		t.Fatalf("next transaction: %+v %v", r, err)
	}
	tm := <-done
	if tm.err != nil {
		t.Fatal(tm.err)
	}
	if !tm.next.After(tm.babbleEnd) {
		t.Fatalf("the next request went out %v before the babble ended", tm.babbleEnd.Sub(tm.next))
	}
	if st := b.Stats(); st.CRCErrors != 1 || st.FrameErrors != 0 || st.Transactions != 2 {
		t.Errorf("stats %+v", st)
	}
}

// The RS-485 adapter unplugged and plugged back: transactions fail
// meanwhile (ErrNotSent while the port is down, or ErrTimeout), the port
// reopens by itself, and the bus serves again.
func TestBusRTUUnplugReplug(t *testing.T) {
	f := newRTU(t, 19200, "N", 7)
	b, logs := openTestBus(t, BusConfig{Name: "rs485", RTU: &f.port})
	if err := readHolding(b, 7, 2); err != nil {
		t.Fatal(err)
	}
	f.slave.Stop()
	f.pair.Unplug()
	eventually(t, "the port seen down", func() error {
		err := readHolding(b, 7, 2)
		if !errors.Is(err, ErrNotSent) || !errors.Is(err, serial.ErrPortDown) {
			return fmt.Errorf("want ErrNotSent with the port down, got %v", err)
		}
		return nil
	})
	f.pair.Replug(t)
	f.slave.Restart(t)
	eventually(t, "recovery after the replug", func() error { return readHolding(b, 7, 2) })
	if st := b.Stats(); st.NotSent == 0 {
		t.Errorf("stats %+v", st)
	}
	if !strings.Contains(logs.String(), "serial port lost") || !strings.Contains(logs.String(), "bus=rs485") {
		t.Errorf("no port loss in the log:\n%s", logs)
	}
}
