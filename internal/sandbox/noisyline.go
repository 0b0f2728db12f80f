package sandbox

import (
	"errors"
	"math/rand/v2"
	"os"
	"sync"
)

// LineNoise sets per-byte fault probabilities on a NoisyLine, each from 0
// to 1 and applied independently to every byte in both directions. The zero
// value is a clean line.
type LineNoise struct {
	Flip   float64 // the byte arrives with one random bit flipped
	Insert float64 // a random garbage byte arrives before it
	Drop   float64 // the byte never arrives
}

// LineStats counts what a NoisyLine did, both directions together.
type LineStats struct {
	Forwarded int64 // bytes delivered, corrupted or not (garbage not included)
	Flipped   int64 // delivered with a flipped bit
	Inserted  int64 // garbage bytes inserted
	Dropped   int64 // dropped by noise
	Lost      int64 // written while unplugged
}

// NoisyLineConfig configures a NoisyLine. The zero value is a clean,
// plugged-in line.
type NoisyLineConfig struct {
	Noise LineNoise
	Seed  uint64 // 0 picks a random seed
}

// NoisyLine is a null-modem cable between two pseudo-terminals, like
// PtyPair, whose relay can corrupt the bytes it carries — flip bits, insert
// garbage, drop bytes — and can be unplugged: while unplugged, bytes written
// at either end are lost, as on a pulled cable (the ends stay open; a
// program sees silence, not a hang-up). With no noise it is transparent.
type NoisyLine struct {
	A, B string // the two ends' tty paths

	masters [2]*os.File
	slaves  [2]*os.File
	wg      sync.WaitGroup
	once    sync.Once

	mu        sync.Mutex
	noise     LineNoise
	unplugged bool
	rng       *rand.Rand
	stats     LineStats
}

// NewNoisyLine opens two ptys and relays between them until Close.
func NewNoisyLine(cfg NoisyLineConfig) (*NoisyLine, error) {
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	l := &NoisyLine{noise: cfg.Noise, rng: rand.New(rand.NewPCG(seed, ^seed))}
	for i := range 2 {
		m, s, err := OpenPty()
		if err != nil {
			l.Close()
			return nil, err
		}
		// The relay keeps each slave open so the master never reads EIO
		// while no program has the end open.
		l.masters[i], l.slaves[i] = m, s
	}
	l.A, l.B = l.slaves[0].Name(), l.slaves[1].Name()
	l.pump(l.masters[0], l.masters[1])
	l.pump(l.masters[1], l.masters[0])
	return l, nil
}

// SetNoise changes the noise from now on.
func (l *NoisyLine) SetNoise(n LineNoise) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noise = n
}

// Unplug disconnects the cable: bytes written at either end from now on
// are lost until Plug.
func (l *NoisyLine) Unplug() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unplugged = true
}

// Plug reconnects the cable.
func (l *NoisyLine) Plug() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unplugged = false
}

// Stats returns the counters so far.
func (l *NoisyLine) Stats() LineStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

func (l *NoisyLine) pump(from, to *os.File) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		in := make([]byte, 4096)
		var out []byte
		for {
			n, err := from.Read(in)
			if n > 0 {
				out = l.mangle(out[:0], in[:n])
				if len(out) > 0 {
					if _, werr := to.Write(out); werr != nil {
						return
					}
				}
			}
			if err != nil {
				return // Close closed the masters
			}
		}
	}()
}

// mangle appends what the line delivers for in to out.
func (l *NoisyLine) mangle(out, in []byte) []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unplugged {
		l.stats.Lost += int64(len(in))
		return out
	}
	nz := l.noise
	if nz == (LineNoise{}) {
		l.stats.Forwarded += int64(len(in))
		return append(out, in...)
	}
	for _, b := range in {
		if nz.Insert > 0 && l.rng.Float64() < nz.Insert {
			out = append(out, byte(l.rng.UintN(256)))
			l.stats.Inserted++
		}
		if nz.Drop > 0 && l.rng.Float64() < nz.Drop {
			l.stats.Dropped++
			continue
		}
		if nz.Flip > 0 && l.rng.Float64() < nz.Flip {
			b ^= 1 << l.rng.UintN(8)
			l.stats.Flipped++
		}
		out = append(out, b)
		l.stats.Forwarded++
	}
	return out
}

// Close stops the relay and closes both ptys. Programs with an end open
// see their port hang up. It is idempotent.
func (l *NoisyLine) Close() error {
	var errs []error
	l.once.Do(func() {
		for _, f := range l.masters {
			if f != nil {
				errs = append(errs, f.Close())
			}
		}
		l.wg.Wait()
		for _, f := range l.slaves {
			if f != nil {
				errs = append(errs, f.Close())
			}
		}
	})
	return errors.Join(errs...)
}
