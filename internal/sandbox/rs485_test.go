package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/bits"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// rsDeadline bounds every wait in the RS485 tests; nothing is asserted
// about it.
const rsDeadline = 30 * time.Second

func newLine(t testing.TB, cfg RS485Config) *RS485 {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	l, err := NewRS485(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// openEnd opens an end's tty path as a program opens its serial port.
func openEnd(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// readN reads exactly n bytes from an end, failing the test at rsDeadline.
func readN(t testing.TB, f *os.File, n int) []byte {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(rsDeadline)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// hears writes msg at from and checks that each of to reads it next.
func hears(t testing.TB, from *os.File, msg string, to ...*os.File) {
	t.Helper()
	write(t, from, []byte(msg))
	for _, f := range to {
		if got := readN(t, f, len(msg)); string(got) != msg {
			t.Fatalf("%s got %q, want %q", f.Name(), got, msg)
		}
	}
}

func write(t testing.TB, f *os.File, b []byte) {
	t.Helper()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func TestRS485BadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, cfg := range []RS485Config{
		{Drops: 1, Dir: dir},
		{Baud: 9600, Dir: dir},
		{Baud: 9600, Drops: 248, Dir: dir},
		{Baud: 9600, Drops: 1, Dir: dir, Parity: "X"},
		{Baud: 9600, Drops: 1, Dir: dir, DataBits: 9},
		{Baud: 9600, Drops: 1, Dir: dir, StopBits: 3},
		{Baud: 9600, Drops: 1},
		{Baud: 9600, Drops: 1, Dir: dir + "/missing"},
	} {
		if l, err := NewRS485(cfg); !errors.Is(err, ErrLineConfig) {
			if l != nil {
				l.Close()
			}
			t.Errorf("NewRS485(%+v) = %v, want ErrLineConfig", cfg, err)
		}
	}
	l := newLine(t, RS485Config{Baud: 9600, Drops: 2})
	for _, err := range []error{l.FlipBits(-1, ToDrops), l.FlipBits(1, Direction(7)), l.Cut(2, true), l.Cut(-1, true)} {
		if !errors.Is(err, ErrLineConfig) {
			t.Errorf("got %v, want ErrLineConfig", err)
		}
	}
}

// TestRS485Bus: what the master writes reaches every drop; what a drop
// writes reaches the master and, only with DropsHearDrops, the other drops;
// no end hears itself.
func TestRS485Bus(t *testing.T) {
	for _, hear := range []bool{false, true} {
		t.Run(fmt.Sprintf("DropsHearDrops=%v", hear), func(t *testing.T) {
			l := newLine(t, RS485Config{Baud: 115200, Parity: "E", Drops: 3, DropsHearDrops: hear})
			m := openEnd(t, l.Master)
			drops := make([]*os.File, len(l.Drops))
			for i, p := range l.Drops {
				drops[i] = openEnd(t, p)
			}
			for round := range 2 {
				req := fmt.Appendf(nil, "request %d", round)
				write(t, m, req)
				for i, d := range drops {
					if got := readN(t, d, len(req)); !bytes.Equal(got, req) {
						t.Fatalf("drop %d got %q, want %q", i, got, req)
					}
				}
				for i, d := range drops {
					ans := fmt.Appendf(nil, "answer %d from %d", round, i)
					write(t, d, ans)
					if got := readN(t, m, len(ans)); !bytes.Equal(got, ans) {
						t.Fatalf("master got %q, want %q", got, ans)
					}
					for j, o := range drops {
						if hear && j != i {
							if got := readN(t, o, len(ans)); !bytes.Equal(got, ans) {
								t.Fatalf("drop %d got %q, want %q", j, got, ans)
							}
						}
					}
				}
			}
			// What a drop hears next is the master's: it did not hear
			// itself (nor, by default, the others).
			write(t, m, []byte("end"))
			for i, d := range drops {
				if got := readN(t, d, 3); string(got) != "end" {
					t.Errorf("drop %d got %q before the master's next bytes", i, got)
				}
			}
			st := l.Stats()
			t.Logf("%+v", st)
			if st.ToDrops.Frames != 3 || st.ToMaster.Frames != 6 || st.Corrupted() != 0 || st.Lost != 0 {
				t.Errorf("stats %+v: want 3 frames to the drops, 6 to the master, none corrupted or lost", st)
			}
		})
	}
}

// sendTimed writes n bytes at from and returns how long until the last
// one was read at to.
func sendTimed(t testing.TB, from, to *os.File, n int) time.Duration {
	t.Helper()
	msg := make([]byte, n)
	for i := range msg {
		msg[i] = byte(i)
	}
	start := time.Now()
	write(t, from, msg)
	got := readN(t, to, n)
	d := time.Since(start)
	if !bytes.Equal(got, msg) {
		t.Fatalf("bytes changed on the line")
	}
	return d
}

// TestRS485Pacing: n bytes take n character times end to end, never less
// (only a lower bound is asserted: a slow machine may take longer).
func TestRS485Pacing(t *testing.T) {
	for _, c := range []struct {
		parity string
		n      int
		bits   int
	}{{"N", 1000, 10}, {"E", 200, 11}} {
		l := newLine(t, RS485Config{Baud: 9600, Parity: c.parity, Drops: 1})
		m, d := openEnd(t, l.Master), openEnd(t, l.Drops[0])
		want := time.Duration(int64(c.n*c.bits) * int64(time.Second) / 9600)
		if got := l.CharTime() * time.Duration(c.n); got < want || got > want+time.Duration(c.n) {
			t.Errorf("8%s1: CharTime %v, want %v", c.parity, l.CharTime(), want/time.Duration(c.n))
		}
		down, up := sendTimed(t, m, d, c.n), sendTimed(t, d, m, c.n)
		t.Logf("8%s1 at 9,600: %d bytes down %v, up %v, nominal %v", c.parity, c.n, down, up, want)
		if down < want || up < want {
			t.Errorf("8%s1: %d bytes took %v down, %v up: less than the line allows (%v)", c.parity, c.n, down, up, want)
		}
	}
}

// rtuFrame is a Modbus RTU request to read register i of unit 1.
func rtuFrame(t testing.TB, i int) []byte {
	t.Helper()
	f, err := modbus.EncodeRTU(1, []byte{0x03, 0, byte(i), 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// flipped reports whether got is want with exactly one bit flipped.
func flipped(got, want []byte) bool {
	n := 0
	for i := range want {
		n += bits.OnesCount8(got[i] ^ want[i])
	}
	return len(got) == len(want) && n == 1
}

// TestRS485FlipBits: FlipBits corrupts exactly the next n frames of its
// direction, one bit each, identically for every listener.
func TestRS485FlipBits(t *testing.T) {
	l := newLine(t, RS485Config{Baud: 115200, Drops: 2})
	m, d0, d1 := openEnd(t, l.Master), openEnd(t, l.Drops[0]), openEnd(t, l.Drops[1])
	silence := func() { time.Sleep(4 * l.CharTime()) } // ≥ t3.5: the next write is a new frame
	// check sends frame i from 'from' and reports whether it arrived corrupted.
	check := func(from *os.File, to []*os.File, i int) bool {
		t.Helper()
		want := rtuFrame(t, i)
		write(t, from, want)
		got := readN(t, to[0], len(want))
		for _, o := range to[1:] {
			if other := readN(t, o, len(want)); !bytes.Equal(other, got) {
				t.Fatalf("frame %d: listeners heard % x and % x", i, got, other)
			}
		}
		silence()
		if bytes.Equal(got, want) {
			return false
		}
		if !flipped(got, want) {
			t.Fatalf("frame %d: got % x for % x: not one bit flipped", i, got, want)
		}
		if _, err := modbus.DecodeRTU(got, 1); err == nil {
			t.Fatalf("frame %d: a flipped frame passed the CRC", i)
		}
		return true
	}
	if err := l.FlipBits(3, ToDrops); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if bad := check(m, []*os.File{d0, d1}, i); bad != (i < 3) {
			t.Errorf("master frame %d corrupted=%v, want %v", i, bad, i < 3)
		}
	}
	if err := l.FlipBits(2, ToMaster); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if check(m, []*os.File{d0, d1}, i) {
			t.Errorf("master frame %d corrupted after FlipBits(ToMaster)", i)
		}
		if bad := check(d0, []*os.File{m}, i); bad != (i < 2) {
			t.Errorf("drop frame %d corrupted=%v, want %v", i, bad, i < 2)
		}
	}
	if err := l.FlipBits(1, EitherWay); err != nil {
		t.Fatal(err)
	}
	if !check(d1, []*os.File{m}, 0) || check(m, []*os.File{d0, d1}, 1) {
		t.Errorf("FlipBits(1, EitherWay) did not corrupt exactly the next frame")
	}
	st := l.Stats()
	t.Logf("%+v", st)
	if st.Flipped != 6 || st.ToDrops.Frames != 13 || st.ToMaster.Frames != 5 || st.Collided != 0 {
		t.Errorf("stats %+v: want 6 flipped of 13 frames down and 5 up", st)
	}
}

// TestRS485Collision: two drops answering at once garble the line: the
// master hears neither answer intact.
func TestRS485Collision(t *testing.T) {
	// At 1,200 baud a 20-byte answer holds the line 183 ms: the second
	// write comes long before the first ends, unless the machine stalls,
	// in which case the round is tried again.
	l := newLine(t, RS485Config{Baud: 1200, Drops: 2})
	m, d0, d1 := openEnd(t, l.Master), openEnd(t, l.Drops[0]), openEnd(t, l.Drops[1])
	a, b := bytes.Repeat([]byte{0x5a}, 20), bytes.Repeat([]byte{0xa5}, 20)
	b[0], b[19] = 0x01, 0xfe
	for round := range 5 {
		before := l.Stats()
		write(t, d0, a)
		write(t, d1, b)
		var got []byte
		for len(got) < len(a) {
			got = append(got, readN(t, m, 1)...)
			if l.Stats().ToMaster.Bytes == before.ToMaster.Bytes+uint64(len(a)+len(b)) {
				break // both are on the line
			}
		}
		// Wait for the line to go quiet, then take the rest.
		for st := l.Stats(); st.ToMaster.Bytes < before.ToMaster.Bytes+uint64(len(a)+len(b)); st = l.Stats() {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		got = append(got, drain(t, m)...)
		st := l.Stats()
		if bytes.Contains(got, a) || bytes.Contains(got, b) {
			t.Fatalf("round %d: the master heard a clean answer in % x (%+v)", round, got, st)
		}
		if st.Collided > before.Collided {
			t.Logf("round %d: heard % x; %+v", round, got, st)
			return
		}
		t.Logf("round %d: the answers did not overlap; again", round)
	}
	t.Fatal("no collision in 5 rounds")
}

// drain returns what f has to read right now.
func drain(t testing.TB, f *os.File) []byte {
	var out []byte
	buf := make([]byte, 256)
	for {
		if err := f.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out
		}
	}
}

// TestRS485Cut: a cut drop hears nothing and its bytes are lost; connected
// again, it is back on the bus.
func TestRS485Cut(t *testing.T) {
	l := newLine(t, RS485Config{Baud: 115200, Drops: 2})
	m, d0, d1 := openEnd(t, l.Master), openEnd(t, l.Drops[0]), openEnd(t, l.Drops[1])
	if err := l.Cut(1, true); err != nil {
		t.Fatal(err)
	}
	hears(t, m, "one", d0)
	write(t, d1, []byte("lost"))
	hears(t, d0, "heard", m)
	// The cut drop's bytes are lost when the line reads them from its pty,
	// which may be after the exchange above: wait, or reconnecting first
	// would put them on the line.
	waitUntil(t, "the line drops what the cut drop wrote", func() bool { return l.Stats().Lost == 4 })
	if err := l.Cut(1, false); err != nil {
		t.Fatal(err)
	}
	hears(t, m, "two", d1) // and not "one"
	hears(t, d1, "back", m)
	if st := l.Stats(); st.Lost != 4 {
		t.Errorf("Lost %d, want the 4 bytes the cut drop wrote", st.Lost)
	}
}

// TestRS485UnplugReplug: the master's adapter pulled and plugged back, as a
// transport/serial.Conn on the Master path sees it: the port lost, the path
// missing, then reopened and on the bus again.
func TestRS485UnplugReplug(t *testing.T) {
	l := newLine(t, RS485Config{Baud: 19200, Parity: "E", Drops: 1})
	d := openEnd(t, l.Drops[0])
	conn, err := serial.OpenConn(serial.ConnConfig{
		Port:       serial.PortConfig{Path: l.Master, Baud: 19200, Parity: "E"},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	heard := make(chan byte, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			n, err := conn.Read(buf)
			for _, c := range buf[:n] {
				heard <- c
			}
			if errors.Is(err, serial.ErrClosed) {
				return
			}
		}
	}()
	defer func() { conn.Close(); <-done }()
	expect := func(want string) {
		t.Helper()
		for i := range len(want) {
			select {
			case c := <-heard:
				if c != want[i] {
					t.Fatalf("gateway heard %q at %d of %q", c, i, want)
				}
			case <-time.After(rsDeadline):
				t.Fatalf("gateway did not hear %q", want)
			}
		}
	}
	exchange := func(ping, pong string) {
		t.Helper()
		if _, err := conn.Write([]byte(ping)); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, d, len(ping)); string(got) != ping {
			t.Fatalf("drop got %q", got)
		}
		write(t, d, []byte(pong))
		expect(pong)
	}
	exchange("ping", "pong")

	if err := l.Unplug(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway finds its port missing", func() bool {
		return conn.Stats().Losses == 1 && errors.Is(conn.Err(), serial.ErrPortMissing)
	})
	if _, err := os.Lstat(l.Master); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Master path after Unplug: %v", err)
	}
	if _, err := conn.Write([]byte("x")); !errors.Is(err, serial.ErrPortDown) {
		t.Errorf("Write while unplugged: %v", err)
	}
	write(t, d, []byte("nobody"))
	waitUntil(t, "the drop's bytes lost", func() bool { return l.Stats().Lost == 6 })

	if err := l.Replug(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway reopens", func() bool { return conn.Err() == nil && conn.Stats().Opens == 2 })
	exchange("again", "back")
	t.Logf("conn %+v, line %+v", conn.Stats(), l.Stats())
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(rsDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRS485CloseHangsUp: Close hangs up the programs' ends and removes the
// paths; it is idempotent, and FlipBits, Cut, Unplug and Replug after it
// do no harm.
func TestRS485CloseHangsUp(t *testing.T) {
	dir := t.TempDir()
	l := newLine(t, RS485Config{Baud: 9600, Drops: 2, Dir: dir})
	d := openEnd(t, l.Drops[1])
	l.Close()
	if err := d.SetReadDeadline(time.Now().Add(rsDeadline)); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("read after Close: %d, %v; want a hang-up", n, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("Close left %v in Dir", entries)
	}
	l.Close()
	_ = l.FlipBits(1, EitherWay)
	_ = l.Cut(0, true)
	if err := l.Unplug(); err != nil {
		t.Error(err)
	}
	if err := l.Replug(); !errors.Is(err, ErrClosed) {
		t.Errorf("Replug after Close: %v", err)
	}
}

// startSlaves runs a pymodbus RTU server (internal/modbustest) on each
// drop of a 9,600-baud line, unit i+1 on drop i, and waits until mbpoll
// reads units 1 and 2. It returns the line's counters before that last,
// successful poll. (Before the servers are up, a late answer may collide
// with mbpoll's next request.)
func startSlaves(t testing.TB, l *RS485) RS485Stats {
	t.Helper()
	for i, p := range l.Drops {
		modbustest.StartRTU(t, p, modbustest.Options{Units: []byte{byte(i + 1)}, Baud: 9600})
	}
	var before RS485Stats
	waitUntil(t, "mbpoll to read units 1 and 2", func() bool {
		before = l.Stats()
		return pollBoth(l) == 2
	})
	return before
}

// pollBoth reads holding registers 0-2 (mbpoll's references 1-3) of
// units 1 and 2 with mbpoll, as the bus master, and returns how many units
// answered right (modbustest.Initial: unit u's register a holds u·256 + a).
func pollBoth(l *RS485) int {
	out, _ := exec.Command("mbpoll", "-m", "rtu", "-a", "1,2", "-b", "9600", "-P", "none",
		"-t", "4", "-r", "1", "-c", "3", "-o", "0.5", "-1", l.Master).CombinedOutput()
	return bytes.Count(out, []byte("[1]: \t256\n[2]: \t257\n[3]: \t258\n")) +
		bytes.Count(out, []byte("[1]: \t512\n[2]: \t513\n[3]: \t514\n"))
}

// TestRS485ExternalPrograms: real programs on the line: two pymodbus RTU
// servers, units 1 and 2, each on its own drop, and mbpoll as the master
// reading both over the one bus.
func TestRS485ExternalPrograms(t *testing.T) {
	modbustest.Require(t)
	l := newLine(t, RS485Config{Baud: 9600, Drops: 2})
	before := startSlaves(t, l)
	st := l.Stats()
	t.Logf("line %+v", st)
	if st.ToDrops.Frames-before.ToDrops.Frames != 2 || st.ToMaster.Frames-before.ToMaster.Frames != 2 ||
		st.Corrupted() != before.Corrupted() {
		t.Errorf("line %+v, before the last poll %+v: want 2 requests and 2 answers, none corrupted", st, before)
	}
}

// BenchmarkRS485DropsHearDrops is why drops do not hear each other by
// default: the share of mbpoll's reads of two pymodbus servers answered,
// with the drops isolated and hearing each other.
func BenchmarkRS485DropsHearDrops(b *testing.B) {
	for _, hear := range []bool{false, true} {
		b.Run(fmt.Sprintf("hear=%v", hear), func(b *testing.B) {
			l := newLine(b, RS485Config{Baud: 9600, Drops: 2, DropsHearDrops: hear})
			startSlaves(b, l)
			answered := 0
			for b.Loop() {
				answered += pollBoth(l)
			}
			b.ReportMetric(float64(answered)/float64(2*b.N), "answered")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRS485Pacing measures the line against its nominal rate: bytes/s
// delivered from the master's write to the drop's last read, their ratio
// to the rate (≤ 1: never faster), and how late a byte is read after its
// character ends on a real line (p50 and max over the chunks read).
func BenchmarkRS485Pacing(b *testing.B) {
	for _, baud := range []int{9600, 115200} {
		b.Run("baud="+strconv.Itoa(baud), func(b *testing.B) {
			l := newLine(b, RS485Config{Baud: baud, Drops: 1})
			m, d := openEnd(b, l.Master), openEnd(b, l.Drops[0])
			const n = 960 // 1 s at 9,600 8N1
			msg := bytes.Repeat([]byte{0x55}, n)
			buf := make([]byte, n)
			var total time.Duration
			var late []time.Duration
			for b.Loop() {
				start := time.Now()
				write(b, m, msg)
				for got := 0; got < n; {
					k, err := d.Read(buf[got:])
					if err != nil {
						b.Fatal(err)
					}
					got += k
					late = append(late, time.Since(start)-time.Duration(got)*l.CharTime())
				}
				total += time.Since(start)
			}
			rate := float64(b.N*n) / total.Seconds()
			nominal := float64(time.Second) / float64(l.CharTime())
			slices.Sort(late)
			b.ReportMetric(rate, "B/s")
			b.ReportMetric(rate/nominal, "ratio")
			b.ReportMetric(float64(late[len(late)/2].Microseconds()), "late-p50-µs")
			b.ReportMetric(float64(late[len(late)-1].Microseconds()), "late-max-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
}
