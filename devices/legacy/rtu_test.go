package legacy_test

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// testWait bounds every wait of these tests; nothing is timed tightly.
const testWait = 30 * time.Second

// serveRTU runs s on the master of a fresh raw pty until the test ends,
// and returns the path of the pty's slave end, for the master under test.
func serveRTU(t *testing.T, s *legacy.Slave) string {
	t.Helper()
	m, tty, err := sandbox.OpenPty()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); tty.Close() }) // after serve's: cleanups run last first
	serve(t, func(ctx context.Context) error { return s.ServeRTU(ctx, m) })
	return tty.Name()
}

// serveTCP runs s on a free 127.0.0.1 port until the test ends.
func serveTCP(t *testing.T, s *legacy.Slave) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, func(ctx context.Context) error { return s.ServeTCP(ctx, ln) })
	return ln.Addr().String()
}

// serve runs f until the test ends, then cancels it and checks it
// returned nil, and within testWait.
func serve(t *testing.T, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(testWait):
			t.Errorf("serve still running %v after its context ended", testWait)
		}
	})
}

// The simulated slave speaks Modbus RTU and TCP as mbpoll, a master nobody
// here wrote, expects: writes land in the addressed unit, reads return
// them, another unit on the same line stays untouched, and ServeRTU ends
// with its context.
func TestSlaveAnswersMbpoll(t *testing.T) {
	modbustest.Require(t)
	u7, u9 := legacy.NewRegisters("u7", 16, nil), legacy.NewRegisters("u9", 16, nil)
	s := &legacy.Slave{Units: legacy.Units{7: u7, 9: u9}, Baud: 19200}
	rtu := modbustest.Target{Path: serveRTU(t, s), Baud: 19200}
	tcp := modbustest.Target{Addr: serveTCP(t, s)}

	modbustest.MbpollWrite(t, rtu, 7, modbustest.HoldingRegisters, 4, 250, 251)
	if got := modbustest.MbpollRead(t, rtu, 7, modbustest.HoldingRegisters, 4, 2); !slices.Equal(got, []uint16{250, 251}) {
		t.Fatalf("RTU read back %v", got)
	}
	if v, _ := u9.Register(4); v != 0 {
		t.Fatalf("unit 9 register 4 = %d: another unit's write applied", v)
	}
	modbustest.MbpollWrite(t, tcp, 9, modbustest.HoldingRegisters, 0, 4242)
	if got := modbustest.MbpollRead(t, tcp, 9, modbustest.HoldingRegisters, 0, 1); got[0] != 4242 {
		t.Fatalf("TCP read back %v", got)
	}
	if st := s.Stats(); st.Requests != 4 || st.Bad != 0 || st.Foreign != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// transport/modbus's bus master against the slave, on RTU and TCP: a
// write, the read back, a refusal named by its exception, and a unit
// nobody answers for (its timeout, then the next transaction works).
func TestSlaveAnswersBus(t *testing.T) {
	u1 := legacy.NewRegisters("u1", 8, nil)
	s := &legacy.Slave{Units: legacy.Units{1: u1}, Baud: 115200}
	for name, cfg := range map[string]modbus.BusConfig{
		"rtu": {RTU: &serial.PortConfig{Path: serveRTU(t, s), Baud: 115200}},
		"tcp": {TCP: serveTCP(t, s)},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Name, cfg.Timeout = name, 300*time.Millisecond
			b, err := modbus.OpenBus(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			if _, err := b.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncWriteMultiple, Addr: 2, Values: []uint16{7, 8}}); err != nil {
				t.Fatal(err)
			}
			r, err := b.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncReadHolding, Addr: 1, Count: 3})
			if err != nil || !slices.Equal(r.Values, []uint16{0, 7, 8}) {
				t.Fatalf("read back %+v %v", r, err)
			}
			_, err = b.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncReadHolding, Addr: 7, Count: 2})
			if !errors.Is(err, modbus.ErrException) || r == nil {
				t.Fatalf("read beyond the bank: %v", err)
			}
			if _, err := b.Transact(ctx, 5, &modbus.Request{Func: modbus.FuncReadHolding, Count: 1}); !errors.Is(err, modbus.ErrTimeout) {
				t.Fatalf("absent unit: %v", err)
			}
			if _, err := b.Transact(ctx, 1, &modbus.Request{Func: modbus.FuncWriteSingle, Addr: 0, Values: []uint16{9}}); err != nil {
				t.Fatalf("after an absent unit: %v", err)
			}
			if st := b.Stats(); st.CRCErrors+st.FrameErrors != 0 || st.Timeouts != 1 || st.Exceptions != 1 {
				t.Fatalf("bus stats %+v", st)
			}
		})
	}
	if st := s.Stats(); st.Requests != 8 || st.Foreign != 2 || st.Bad != 0 {
		t.Fatalf("slave stats %+v", st)
	}
}

// Bad frames on the line, written by hand: each is counted and dropped,
// and the slave answers the next good frame, whether it follows at once
// (resynchronised byte by byte) or after a silence. A broadcast write is
// applied by every unit and answered by none.
func TestSlaveRTUBadFrames(t *testing.T) {
	u1, u2 := legacy.NewRegisters("u1", 8, nil), legacy.NewRegisters("u2", 8, nil)
	s := &legacy.Slave{Units: legacy.Units{1: u1, 2: u2}, Baud: 115200}
	line, err := os.OpenFile(serveRTU(t, s), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer line.Close()
	frame := func(unit byte, pdu ...byte) []byte {
		f, err := modbus.EncodeRTU(unit, pdu)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	read := frame(1, modbus.FuncReadHolding, 0, 3, 0, 1)
	want := frame(1, modbus.FuncReadHolding, 2, 0, 0)
	corrupt := slices.Clone(read)
	corrupt[3] ^= 0x04
	for name, c := range map[string]struct {
		send [][]byte
		gap  time.Duration
	}{
		"CRC error, then a good frame at once":         {send: [][]byte{corrupt, read}},
		"noise, then a good frame at once":             {send: [][]byte{{0xff, 0x03, 0x00}, read}},
		"noise of a long frame, a silence, a good one": {send: [][]byte{{0xff, 0x10, 0, 0, 0, 1, 2}, read}, gap: 3 * legacy.MinSilence},
		"half a frame, a silence, then a good one":     {send: [][]byte{read[:5], read}, gap: 3 * legacy.MinSilence},
		"a huge byte count, a silence, a good one":     {send: [][]byte{{1, modbus.FuncWriteMultiple, 0, 0, 0, 1, 250}, read}, gap: 3 * legacy.MinSilence},
		"another unit's answer, then a good frame":     {send: [][]byte{frame(9, modbus.FuncReadHolding, 2, 0, 0), read}},
	} {
		before := s.Stats().Bad
		for i, b := range c.send {
			if i > 0 {
				time.Sleep(c.gap)
			}
			if _, err := line.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		if got := readFrame(t, name, line, len(want)); !slices.Equal(got, want) {
			t.Fatalf("%s: answer % x, want % x", name, got, want)
		}
		if bad := s.Stats().Bad - before; bad != 1 {
			t.Errorf("%s: %d bad frames counted, want 1", name, bad)
		}
	}
	if _, err := line.Write(frame(0, modbus.FuncWriteSingle, 0, 5, 0, 42)); err != nil {
		t.Fatal(err)
	}
	if _, err := line.Write(read); err != nil { // the broadcast has no answer: this one's comes first
		t.Fatal(err)
	}
	if got := readFrame(t, "after a broadcast", line, len(want)); !slices.Equal(got, want) {
		t.Fatalf("after a broadcast: % x", got)
	}
	for _, u := range []*legacy.Registers{u1, u2} {
		if v, _ := u.Register(5); v != 42 {
			t.Errorf("broadcast write: register 5 = %d", v)
		}
	}
	if st := s.Stats(); st.Broadcast != 1 || st.Requests != 7 || st.Bad != 6 || st.Foreign != 0 {
		t.Errorf("stats %+v", st)
	}
}

// readFrame reads n bytes from f within testWait.
func readFrame(t *testing.T, what string, f *os.File, n int) []byte {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(testWait)); err != nil {
		t.Fatal(err)
	}
	buf, got := make([]byte, n), 0
	for got < n {
		k, err := f.Read(buf[got:])
		if err != nil {
			t.Fatalf("%s: read %d of %d bytes (% x): %v", what, got, n, buf[:got], err)
		}
		got += k
	}
	return buf
}

// A port whose reads ignore deadlines (creack/pty's master: its Fd call
// leaves it blocking) is refused at once: ServeRTU could never stop.
func TestSlaveRefusesBlockingPort(t *testing.T) {
	m, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&legacy.Slave{}).ServeRTU(ctx, m) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, legacy.ErrBlockingPort) {
			t.Fatalf("a blocking port: %v", err)
		}
	case <-time.After(testWait):
		m.Close() // unblocks the read
		t.Fatalf("ServeRTU on a blocking port did not end %v after its context", testWait)
	}
}
