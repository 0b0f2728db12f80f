package sandbox

import (
	"bytes"
	"errors"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// openEnds opens both ends of a line as a program would.
func openEnds(t *testing.T, l *NoisyLine) (a, b *os.File) {
	t.Helper()
	a, err := os.OpenFile(l.A, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = os.OpenFile(l.B, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

// sendThrough writes msg at from and reads at to until want bytes have
// arrived or nothing more arrives for idle.
func sendThrough(t *testing.T, from, to *os.File, msg []byte, want int, idle time.Duration) []byte {
	t.Helper()
	return sendUntil(t, from, to, msg, func(got int) bool { return got >= want }, idle)
}

// sendUntil writes msg at from and reads at to until done(bytes so far)
// or nothing arrives for idle.
func sendUntil(t *testing.T, from, to *os.File, msg []byte, done func(int) bool, idle time.Duration) []byte {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		_, err := from.Write(msg)
		werr <- err
	}()
	var got []byte
	buf := make([]byte, 4096)
	for last := time.Now(); !done(len(got)) && time.Since(last) < idle; {
		to.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := to.Read(buf)
		got = append(got, buf[:n]...)
		if n > 0 {
			last = time.Now()
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: %v", err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	return got
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func newNoisyLine(t *testing.T, cfg NoisyLineConfig) *NoisyLine {
	t.Helper()
	l, err := NewNoisyLine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return l
}

// TestNoisyLineClean: with no noise the line is transparent both ways.
func TestNoisyLineClean(t *testing.T) {
	l := newNoisyLine(t, NoisyLineConfig{})
	a, b := openEnds(t, l)
	msg := randomBytes(32 << 10)
	if got := sendThrough(t, a, b, msg, len(msg), 2*time.Second); !bytes.Equal(got, msg) {
		t.Fatalf("A→B: %d bytes arrived, differ from the %d sent", len(got), len(msg))
	}
	if got := sendThrough(t, b, a, msg[:1000], 1000, 2*time.Second); !bytes.Equal(got, msg[:1000]) {
		t.Fatal("B→A differs")
	}
	if s := l.Stats(); s.Forwarded != int64(len(msg)+1000) || s.Flipped+s.Inserted+s.Dropped+s.Lost != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestNoisyLineNoise checks each kind of noise really corrupts the stream,
// at about the configured rate, and that the counters match what arrived.
func TestNoisyLineNoise(t *testing.T) {
	const n = 8000
	msg := randomBytes(n)
	t.Run("flip", func(t *testing.T) {
		l := newNoisyLine(t, NoisyLineConfig{Noise: LineNoise{Flip: 0.05}, Seed: 3})
		a, b := openEnds(t, l)
		got := sendThrough(t, a, b, msg, n, 2*time.Second)
		if len(got) != n {
			t.Fatalf("%d bytes arrived, want %d (flips change no length)", len(got), n)
		}
		changed := 0
		for i := range got {
			if d := got[i] ^ msg[i]; d != 0 {
				changed++
				if bits.OnesCount8(d) != 1 {
					t.Fatalf("byte %d: %08b → %08b, more than one bit", i, msg[i], got[i])
				}
			}
		}
		s := l.Stats()
		t.Logf("%d of %d bytes changed; stats %+v", changed, n, s)
		if int64(changed) != s.Flipped || changed < n/40 || changed > n/10 {
			t.Fatalf("%d bytes changed (Flipped %d), want about %d", changed, s.Flipped, n/20)
		}
	})
	t.Run("drop", func(t *testing.T) {
		l := newNoisyLine(t, NoisyLineConfig{Noise: LineNoise{Drop: 0.05}, Seed: 4})
		a, b := openEnds(t, l)
		// Done once every byte is accounted for and the survivors are in.
		got := sendUntil(t, a, b, msg, func(got int) bool {
			s := l.Stats()
			return s.Forwarded+s.Dropped == n && int64(got) == s.Forwarded
		}, 2*time.Second)
		s := l.Stats()
		t.Logf("%d of %d bytes arrived; stats %+v", len(got), n, s)
		if int64(len(got)) != n-s.Dropped || s.Dropped < n/40 || s.Dropped > n/10 {
			t.Fatalf("%d arrived, %d dropped, of %d", len(got), s.Dropped, n)
		}
		if !isSubsequence(got, msg) {
			t.Fatal("what arrived is not the message with bytes left out")
		}
	})
	t.Run("insert", func(t *testing.T) {
		l := newNoisyLine(t, NoisyLineConfig{Noise: LineNoise{Insert: 0.05}, Seed: 5})
		a, b := openEnds(t, l)
		got := sendUntil(t, a, b, msg, func(got int) bool {
			s := l.Stats()
			return s.Forwarded == n && int64(got) == n+s.Inserted
		}, 2*time.Second)
		s := l.Stats()
		t.Logf("%d bytes arrived for %d sent; stats %+v", len(got), n, s)
		if int64(len(got)) != n+s.Inserted || s.Inserted < n/40 || s.Inserted > n/10 {
			t.Fatalf("%d arrived, %d inserted, of %d", len(got), s.Inserted, n)
		}
		if !isSubsequence(msg, got) {
			t.Fatal("the message is not within what arrived")
		}
	})
	t.Run("off-again", func(t *testing.T) {
		l := newNoisyLine(t, NoisyLineConfig{Noise: LineNoise{Flip: 1}})
		a, b := openEnds(t, l)
		if got := sendThrough(t, a, b, []byte("x"), 1, time.Second); bytes.Equal(got, []byte("x")) {
			t.Fatal("Flip=1 left the byte intact")
		}
		l.SetNoise(LineNoise{})
		if got := sendThrough(t, a, b, msg, n, 2*time.Second); !bytes.Equal(got, msg) {
			t.Fatal("not transparent after SetNoise(zero)")
		}
	})
}

// TestNoisyLineUnplug: bytes written while unplugged are lost, the ends
// stay open, and traffic resumes after Plug.
func TestNoisyLineUnplug(t *testing.T) {
	l := newNoisyLine(t, NoisyLineConfig{})
	a, b := openEnds(t, l)
	if got := sendThrough(t, a, b, []byte("one"), 3, time.Second); string(got) != "one" {
		t.Fatalf("got %q", got)
	}
	l.Unplug()
	if _, err := a.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); l.Stats().Lost < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 4 lost", l.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := b.Read(make([]byte, 16)); n != 0 || err == nil {
		t.Fatalf("read %d bytes while unplugged (%v)", n, err)
	}
	l.Plug()
	if got := sendThrough(t, a, b, []byte("two"), 3, time.Second); string(got) != "two" {
		t.Fatalf("after Plug got %q, want %q", got, "two")
	}
	if _, err := io.WriteString(b, "back"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	a.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(a, got); err != nil || string(got) != "back" {
		t.Fatalf("B→A after Plug: %q, %v", got, err)
	}
}

// isSubsequence reports whether sub is s with some bytes left out.
func isSubsequence(sub, s []byte) bool {
	i := 0
	for _, c := range s {
		if i < len(sub) && sub[i] == c {
			i++
		}
	}
	return i == len(sub)
}
