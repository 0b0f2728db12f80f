package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/internal/hrtimer"
)

// RS485Config configures an RS485 line. Baud, Drops and Dir are required;
// the zero value of the others means 8 data bits, no parity, 1 stop bit.
type RS485Config struct {
	Baud     int    // line rate in bits per second (any positive rate: a pty has none)
	DataBits int    // 5..8; default 8 (bytes on the line are masked to them)
	Parity   string // "N" (default), "E" or "O": adds one bit to every character
	StopBits int    // 1 (default) or 2
	Drops    int    // slave ends on the bus, 1..247

	// Dir is an existing directory for the ends' stable paths: symlinks
	// named master, drop0, drop1, ... (removed by Close).
	Dir string

	// DropsHearDrops makes the drops hear each other, as on a real
	// two-wire bus, where a slave's answer reaches every other slave. By
	// default a drop's bytes reach the master only: pymodbus 3.0's RTU
	// server, which the tests run as slaves, empties its buffer when a
	// frame is not its own and so loses sync on a neighbour's answer
	// arriving byte by byte, which would make a multi-slave harness test
	// pymodbus rather than the gateway. The master's bytes reach every
	// drop either way, and collisions garble what every listener hears.
	DropsHearDrops bool

	// Seed seeds the choice of the bits FlipBits flips; 0 picks one.
	Seed uint64
}

// Direction selects the frames FlipBits corrupts.
type Direction int

// Directions on an RS485 line.
const (
	EitherWay Direction = iota // any frame
	ToDrops                    // frames the master sends
	ToMaster                   // frames a drop sends
)

// RS485Flow counts what one side put on the line.
type RS485Flow struct {
	Bytes  uint64 // characters transmitted (collided ones included)
	Frames uint64 // bursts separated by ≥ 3.5 character times of silence
}

// RS485Stats counts what an RS485 line carried.
type RS485Stats struct {
	ToDrops  RS485Flow // sent by the master
	ToMaster RS485Flow // sent by the drops
	// Frames corrupted: by FlipBits (one bit flipped), and by collisions
	// (two ends or more transmitting at once). Their sum is Corrupted().
	Flipped, Collided uint64
	Collisions        uint64 // character slots with two transmitters or more
	// Lost counts bytes that never reached the line or an end: written
	// by a cut drop, queued at the master's adapter when it was
	// unplugged, or due to the master while it is unplugged.
	Lost uint64
	// Overruns counts bytes dropped because an end's pty input was full
	// (a program not reading), as a UART overruns; the line never waits.
	Overruns uint64
}

// Corrupted is the number of frames corrupted on the line.
func (s RS485Stats) Corrupted() uint64 { return s.Flipped + s.Collided }

// RS485 is an RS-485 multi-drop line made of real pseudo-terminals: one
// end for the master (the gateway's USB-RS485 adapter) and one for each
// drop (a slave device's program). Every end is a tty path a program opens
// as its serial port.
//
// The line is half duplex and paced: a character occupies the line for
// one character time (1 start + data + parity + stop bits, at Baud), so a
// frame of n bytes reaches the other ends n character times after it was
// written, and each byte arrives at the end of its character, never
// earlier: the last byte of a burst on time (an hrtimer.Timer paces the
// line, to some 0.1 ms on a quiet machine), the bytes before it in batches
// of about RS485Batch, as a UART's FIFO or a USB adapter hands them over
// (waking for every byte would cost each reader a wake-up a character).
// An end does not hear itself. Two ends transmitting in the same character
// slot collide: every listener gets a byte differing from each one sent.
// Frames are bursts separated by at least 3.5 character times of silence,
// or by a change of transmitter.
//
// Faults can be injected while the line runs, from any goroutine:
// FlipBits, Cut, Unplug and Replug.
//
// A pty has no baud rate and no parity: the line's config alone sets the
// timing, whatever the programs ask of their ends. Linux drops PARENB on a
// pty, which tarm/serial (transport/serial) and mbpoll do not check but
// pyserial (so pymodbus) does, failing with EINVAL: open the ends from
// Python with parity "N".
type RS485 struct {
	Master string   // the master's path: Dir/master, a symlink to its current pty
	Drops  []string // the drops' paths: Dir/drop0, Dir/drop1, ...

	cfg  RS485Config
	char time.Duration // one character on the line
	t35  time.Duration // the silence that ends a frame
	mask byte          // the data bits

	kick      chan struct{} // an end queued bytes
	stop      context.CancelFunc
	hr        *hrtimer.Timer // the line goroutine's: the ends of slots
	wg        sync.WaitGroup
	closeOnce sync.Once

	// out and outF are the bus goroutine's: what one step delivers to
	// each end, and through which file.
	out  [][]byte
	outF []*os.File

	mu       sync.Mutex
	closed   bool
	ends     []*rsEnd // [0] is the master, [1+i] drop i
	rng      *rand.Rand
	flips    [3]int // pending FlipBits by Direction
	stats    RS485Stats
	lineFree time.Time // the end of the last character slot
	fr       rsFrame
}

// rsEnd is one end: a pty whose master side the line reads and writes.
type rsEnd struct {
	f     *os.File // pty master; nil while unplugged
	slave *os.File // held open, so that f never reads EIO between openers
	q     []rsChunk
	cut   bool
}

// rsChunk is bytes an end wrote, queued for the line since at.
type rsChunk struct {
	at time.Time
	b  []byte
}

// rsFrame is the frame on the line.
type rsFrame struct {
	started  bool
	last     int       // transmitter of the last character; collided (-1) for a collision
	end      time.Time // the end of its last character
	n        int       // characters so far
	flipAt   int       // index of the character to flip, or -1
	collided bool
}

const collided = -1

// RS485Batch is how far apart the line delivers the bytes of a burst
// before its last, which comes at the end of its character.
const RS485Batch = 500 * time.Microsecond

// NewRS485 opens the line's ptys, links their paths in cfg.Dir and runs the
// line until Close. A bad config gives an error wrapping ErrLineConfig.
func NewRS485(cfg RS485Config) (*RS485, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	bits := 1 + cfg.DataBits + cfg.StopBits
	if cfg.Parity != "N" {
		bits++
	}
	// Rounded up to the nanosecond: the line is never faster than the rate.
	char := time.Duration((int64(bits)*int64(time.Second) + int64(cfg.Baud) - 1) / int64(cfg.Baud))
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	l := &RS485{
		Master: filepath.Join(cfg.Dir, "master"),
		cfg:    cfg,
		char:   char,
		t35:    char * 7 / 2,
		mask:   byte(1<<cfg.DataBits - 1),
		kick:   make(chan struct{}, 1),
		stop:   func() {},
		hr:     hrtimer.New(),
		out:    make([][]byte, 1+cfg.Drops),
		outF:   make([]*os.File, 1+cfg.Drops),
		rng:    rand.New(rand.NewPCG(seed, ^seed)),
	}
	for i := range 1 + cfg.Drops {
		path := l.Master
		if i > 0 {
			path = filepath.Join(cfg.Dir, "drop"+strconv.Itoa(i-1))
			l.Drops = append(l.Drops, path)
		}
		e, err := plugEnd(path)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.ends = append(l.ends, e)
	}
	for i, e := range l.ends {
		l.wg.Add(1)
		go l.read(i, e.f)
	}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	l.wg.Add(1)
	go l.run(ctx)
	return l, nil
}

func (c RS485Config) withDefaults() (RS485Config, error) {
	bad := func(format string, args ...any) (RS485Config, error) {
		return RS485Config{}, fmt.Errorf("%w: %s", ErrLineConfig, fmt.Sprintf(format, args...))
	}
	if c.DataBits == 0 {
		c.DataBits = 8
	}
	if c.Parity == "" {
		c.Parity = "N"
	}
	if c.StopBits == 0 {
		c.StopBits = 1
	}
	switch {
	case c.Baud <= 0:
		return bad("Baud %d not positive", c.Baud)
	case c.DataBits < 5 || c.DataBits > 8:
		return bad("DataBits %d not in 5..8", c.DataBits)
	case c.Parity != "N" && c.Parity != "E" && c.Parity != "O":
		return bad("Parity %q not one of \"N\", \"E\", \"O\"", c.Parity)
	case c.StopBits != 1 && c.StopBits != 2:
		return bad("StopBits %d not 1 or 2", c.StopBits)
	case c.Drops < 1 || c.Drops > 247:
		return bad("Drops %d not in 1..247", c.Drops)
	case c.Dir == "":
		return bad("Dir is empty")
	}
	if st, err := os.Stat(c.Dir); err != nil || !st.IsDir() {
		return bad("Dir %s is not a directory (%v)", c.Dir, err)
	}
	return c, nil
}

// plugEnd opens a pty and points path at its slave.
func plugEnd(path string) (*rsEnd, error) {
	m, s, err := OpenPty()
	if err != nil {
		return nil, err
	}
	if err := relink(s.Name(), path); err != nil {
		m.Close()
		s.Close()
		return nil, err
	}
	return &rsEnd{f: m, slave: s}, nil
}

// relink points path at target atomically, as udev swings a by-id link.
func relink(target, path string) error {
	tmp := path + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("sandbox: rs485: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sandbox: rs485: %w", err)
	}
	return nil
}

// CharTime is how long one character occupies the line.
func (l *RS485) CharTime() time.Duration { return l.char }

// Stats returns the counters so far.
func (l *RS485) Stats() RS485Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// FlipBits corrupts the next n frames going dir, each by flipping one data
// bit of one of its bytes, chosen at random among the bytes queued when the
// frame starts (the whole frame when its sender wrote it at once, as
// Modbus stacks do). Calls add up.
func (l *RS485) FlipBits(n int, dir Direction) error {
	if n < 0 || dir < EitherWay || dir > ToMaster {
		return fmt.Errorf("%w: FlipBits(%d, %d)", ErrLineConfig, n, dir)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flips[dir] += n
	return nil
}

// Cut disconnects drop (an index into Drops) from the line, or connects it
// again: while cut, what it writes is lost and it hears nothing.
func (l *RS485) Cut(drop int, cut bool) error {
	if drop < 0 || drop >= len(l.Drops) {
		return fmt.Errorf("%w: no drop %d (have %d)", ErrLineConfig, drop, len(l.Drops))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.ends[1+drop]
	e.cut = cut
	if cut {
		l.stats.Lost += e.drain()
	}
	return nil
}

// drain empties the end's queue and returns how many bytes it held.
func (e *rsEnd) drain() uint64 {
	var n uint64
	for _, c := range e.q {
		n += uint64(len(c.b))
	}
	e.q = nil
	return n
}

// Unplug pulls the master's USB adapter: the Master path disappears and
// its pty hangs up (a program with it open reads EOF or EIO), and what the
// line carries to the master is lost until Replug. Unplugging an unplugged
// adapter does nothing.
func (l *RS485) Unplug() error {
	l.mu.Lock()
	e := l.ends[0]
	if l.closed || e.f == nil {
		l.mu.Unlock()
		return nil
	}
	f, s := e.f, e.slave
	e.f, e.slave = nil, nil
	l.stats.Lost += e.drain()
	l.mu.Unlock()
	// The path goes first, so that an opener finds it missing rather than
	// a hung-up tty.
	err := os.Remove(l.Master)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	f.Close() // the reader returns
	s.Close()
	if err != nil {
		return fmt.Errorf("sandbox: rs485 unplug: %w", err)
	}
	return nil
}

// Replug plugs the master's adapter back: a new pty, and the Master path
// pointing at it. Replugging a plugged adapter does nothing.
func (l *RS485) Replug() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.ends[0].f != nil {
		return nil
	}
	e, err := plugEnd(l.Master)
	if err != nil {
		return err
	}
	e.q = nil
	l.ends[0] = e
	l.wg.Add(1)
	go l.read(0, e.f)
	return nil
}

// read queues what the program at end i writes, until f is closed.
func (l *RS485) read(i int, f *os.File) {
	defer l.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			l.queue(i, f, buf[:n])
		}
		if err != nil {
			return // Close, Unplug
		}
	}
}

func (l *RS485) queue(i int, f *os.File, b []byte) {
	at := time.Now()
	l.mu.Lock()
	e := l.ends[i]
	switch {
	case e.f != f: // unplugged meanwhile
		l.stats.Lost += uint64(len(b))
	case e.cut:
		l.stats.Lost += uint64(len(b))
	default:
		e.q = append(e.q, rsChunk{at: at, b: slices.Clone(b)})
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// run is the line: it puts queued bytes on it one character slot at a
// time and delivers each at the end of its slot or later: the bytes of a
// burst in batches RS485Batch apart, its last at the end of its slot. Bytes
// queued during a wait are placed in their slots by the time they were
// written, when the line wakes.
func (l *RS485) run(ctx context.Context) {
	defer l.wg.Done()
	for {
		next, last := l.step(time.Now())
		l.deliver()
		if next.IsZero() {
			select {
			case <-ctx.Done():
				return
			case <-l.kick:
			}
			continue
		}
		wake := time.Now().Add(RS485Batch)
		if wake.Before(next) {
			wake = next
		}
		if last.Before(wake) {
			wake = last
		}
		if l.hr.Until(ctx, wake) != nil {
			return // Close
		}
	}
}

// step runs every character slot that ended by now, collecting what each
// end hears in l.out, and returns when the next slot ends and when the
// burst queued now would end, its characters back to back (zeros if no end
// has anything to send).
func (l *RS485) step(now time.Time) (next, last time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range l.ends {
		l.out[i] = l.out[i][:0]
		l.outF[i] = e.f
	}
	for {
		start, ok := l.nextSlot()
		if !ok {
			return time.Time{}, time.Time{}
		}
		end := start.Add(l.char)
		if end.After(now) {
			return end, start.Add(time.Duration(l.queuedBy(start)) * l.char)
		}
		l.slot(start)
		l.lineFree = end
	}
}

// queuedBy is the most bytes an end has queued whose first was written by
// start: the length of the burst that starts then.
func (l *RS485) queuedBy(start time.Time) int {
	most := 0
	for _, e := range l.ends {
		if len(e.q) == 0 || e.q[0].at.After(start) {
			continue
		}
		n := 0
		for _, c := range e.q {
			n += len(c.b)
		}
		most = max(most, n)
	}
	return most
}

// nextSlot returns when the next character can start: when the line is
// free and some end has a byte queued.
func (l *RS485) nextSlot() (time.Time, bool) {
	var first time.Time
	for _, e := range l.ends {
		if len(e.q) > 0 && (first.IsZero() || e.q[0].at.Before(first)) {
			first = e.q[0].at
		}
	}
	if first.IsZero() {
		return first, false
	}
	if first.Before(l.lineFree) {
		first = l.lineFree
	}
	return first, true
}

// slot puts one character on the line at start: one byte from every end
// with a byte queued by then.
func (l *RS485) slot(start time.Time) {
	var tx []int
	var vals []byte
	for i, e := range l.ends {
		if len(e.q) > 0 && !e.q[0].at.After(start) {
			tx = append(tx, i)
		}
	}
	l.frameAt(start, tx)
	for _, i := range tx {
		e := l.ends[i]
		vals = append(vals, e.q[0].b[0]&l.mask)
		if e.q[0].b = e.q[0].b[1:]; len(e.q[0].b) == 0 {
			e.q = e.q[1:]
		}
		if i == 0 {
			l.stats.ToDrops.Bytes++
		} else {
			l.stats.ToMaster.Bytes++
		}
	}
	v := vals[0]
	if len(tx) > 1 {
		v = l.garble(vals)
	}
	if l.fr.n == l.fr.flipAt {
		v ^= 1 << l.rng.IntN(l.cfg.DataBits)
		l.stats.Flipped++
	}
	l.fr.n++
	l.fr.end = start.Add(l.char)
	l.hear(tx, v)
}

// frameAt tracks frames: the character at start from transmitters tx
// begins a new one after 3.5 characters of silence or when another end
// takes over, and a new frame may be due a flip.
func (l *RS485) frameAt(start time.Time, tx []int) {
	who := tx[0]
	if len(tx) > 1 {
		who = collided
	}
	fresh := !l.fr.started || start.Sub(l.fr.end) >= l.t35 ||
		(who != collided && l.fr.last != collided && who != l.fr.last)
	if fresh {
		l.fr = rsFrame{started: true, flipAt: -1}
		dir := ToMaster
		if tx[0] == 0 {
			dir = ToDrops
		}
		flow := &l.stats.ToMaster
		if dir == ToDrops {
			flow = &l.stats.ToDrops
		}
		flow.Frames++
		if l.takeFlip(dir) {
			l.fr.flipAt = l.rng.IntN(len(l.ends[tx[0]].q[0].b))
		}
	}
	if who == collided && !l.fr.collided {
		l.fr.collided = true
		l.stats.Collided++
	}
	if who == collided {
		l.stats.Collisions++
	}
	l.fr.last = who
}

// takeFlip consumes a pending flip for a frame going dir.
func (l *RS485) takeFlip(dir Direction) bool {
	for _, d := range []Direction{dir, EitherWay} {
		if l.flips[d] > 0 {
			l.flips[d]--
			return true
		}
	}
	return false
}

// garble is what listeners hear when several ends transmit at once: the
// wired AND of their bytes, moved off each of them, so that no listener
// can take it for any.
func (l *RS485) garble(vals []byte) byte {
	v := vals[0]
	for _, x := range vals[1:] {
		v &= x
	}
	for range int(l.mask) + 1 {
		if !slices.Contains(vals, v) {
			break
		}
		v = (v + 1) & l.mask
	}
	return v
}

// hear hands the character v, sent by tx, to every end that hears it.
func (l *RS485) hear(tx []int, v byte) {
	fromMaster := tx[0] == 0
	for i, e := range l.ends {
		switch {
		case slices.Contains(tx, i), e.cut:
		case i > 0 && !fromMaster && !l.cfg.DropsHearDrops:
		case e.f == nil:
			l.stats.Lost++
		default:
			l.out[i] = append(l.out[i], v)
		}
	}
}

// deliver writes what step collected to the ends, never blocking: a pty
// whose input is full loses the rest, as a UART overruns.
func (l *RS485) deliver() {
	var lost, overrun uint64
	for i, b := range l.out {
		if len(b) == 0 {
			continue
		}
		n, err := writeNow(l.outF[i], b)
		if err != nil && n < len(b) {
			lost += uint64(len(b) - n)
		} else {
			overrun += uint64(len(b) - n)
		}
	}
	if lost+overrun > 0 {
		l.mu.Lock()
		l.stats.Lost += lost
		l.stats.Overruns += overrun
		l.mu.Unlock()
	}
}

// writeNow writes what f takes of b at once. The error is not nil only if
// f is unusable (closed by Unplug or Close).
func writeNow(f *os.File, b []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	n := 0
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := syscall.Write(int(fd), b[n:])
			if e == syscall.EINTR {
				continue
			}
			if e != nil {
				if e != syscall.EAGAIN {
					werr = e
				}
				break
			}
			n += m
		}
		return true // never wait for room
	})
	return n, errors.Join(err, werr)
}

// Close stops the line, closes its ptys (programs with an end open see it
// hang up) and removes the ends' paths. It is idempotent.
func (l *RS485) Close() error {
	l.closeOnce.Do(func() {
		var masters, slaves []*os.File
		l.mu.Lock()
		l.closed = true
		for _, e := range l.ends {
			if e.f != nil {
				masters, slaves = append(masters, e.f), append(slaves, e.slave)
				e.f, e.slave = nil, nil
			}
		}
		l.mu.Unlock()
		l.stop()
		for _, f := range masters {
			f.Close() // its reader returns
		}
		l.wg.Wait()
		l.hr.Close()
		for _, f := range slaves {
			f.Close()
		}
		for _, p := range append([]string{l.Master}, l.Drops...) {
			os.Remove(p)
		}
	})
	return nil
}
