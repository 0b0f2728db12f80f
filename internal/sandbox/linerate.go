package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/internal/cputime"
	"github.com/edgefence/edgefence/transport/modbus"
)

// LineRate is a Modbus RTU master's throughput on an RS485 line against
// the line's limit: one transaction at a time, as on any Modbus bus.
type LineRate struct {
	Baud, BitsPerChar  int
	Op                 string // what each transaction was, e.g. "read 1 register (0x03)"
	N, Errors          int    // transactions run, and how many failed
	ReqBytes, RspBytes int
	Elapsed            time.Duration
	// Limit is the least time a transaction takes on this line (RTULimit).
	Limit time.Duration
	// CPU is this process's CPU time (user + system) over the measured
	// transactions: the bus, the line simulator and the slave when they
	// run in it, and whatever else the process runs meanwhile.
	CPU time.Duration
}

// CPUPerTx is the process's mean CPU time a transaction.
func (r LineRate) CPUPerTx() time.Duration {
	if r.N == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.N)
}

// PerTx is the mean time of a transaction.
func (r LineRate) PerTx() time.Duration {
	if r.N == 0 {
		return 0
	}
	return r.Elapsed / time.Duration(r.N)
}

// TxPerSec is the transactions per second achieved.
func (r LineRate) TxPerSec() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// LimitTxPerSec is the transactions per second the line allows.
func (r LineRate) LimitTxPerSec() float64 { return float64(time.Second) / float64(r.Limit) }

// Ratio is the achieved rate over the line's limit (1: at the line rate).
func (r LineRate) Ratio() float64 { return r.TxPerSec() / r.LimitTxPerSec() }

// RTULimit is the least time one RTU transaction holds a line at baud
// whose characters take char: the t3.5 silence before the request, its
// req characters, the t3.5 silence before the answer and its rsp
// characters (t3.5 from modbus.TimingFor: 3.5 characters of 11 bits, fixed
// at 1.75 ms above 19,200 baud, as both ends keep it).
func RTULimit(baud int, char time.Duration, req, rsp int) (time.Duration, error) {
	t, err := modbus.TimingFor(baud)
	if err != nil {
		return 0, err
	}
	return 2*t.T35 + time.Duration(req+rsp)*char, nil
}

// BitsPerChar is the bits one character takes on the line: start, data,
// parity if any, stop.
func (l *RS485) BitsPerChar() int {
	bits := 1 + l.cfg.DataBits + l.cfg.StopBits
	if l.cfg.Parity != "N" {
		bits++
	}
	return bits
}

// MeasureLineRate runs n transactions of q to unit on bus, whose RTU port
// is l's Master, one after another after a few unmeasured ones, and
// returns the rate against the line's limit. A failed transaction is
// counted, not fatal, unless a tenth of them fail.
func (l *RS485) MeasureLineRate(ctx context.Context, bus *modbus.Bus, unit byte, q *modbus.Request, op string, n int) (LineRate, error) {
	pdu, err := q.Encode()
	if err != nil {
		return LineRate{}, err
	}
	r := LineRate{Baud: l.cfg.Baud, BitsPerChar: l.BitsPerChar(), Op: op, ReqBytes: 3 + len(pdu), RspBytes: 3 + modbus.ResponseLen(q)}
	if r.Limit, err = RTULimit(l.cfg.Baud, l.char, r.ReqBytes, r.RspBytes); err != nil {
		return r, err
	}
	for range 3 { // warm up: the port open, the slave past its first frame
		if _, err := bus.Transact(ctx, unit, q); err != nil {
			return r, fmt.Errorf("sandbox: line rate warm-up: %w", err)
		}
	}
	start, cpu := time.Now(), cputime.Process()
	for range n {
		if _, err := bus.Transact(ctx, unit, q); err != nil {
			if r.Errors++; ctx.Err() != nil || r.Errors > n/10 {
				return r, fmt.Errorf("sandbox: line rate: %d of %d transactions failed: %w", r.Errors, r.N+1, err)
			}
		}
		r.N++
	}
	r.Elapsed, r.CPU = time.Since(start), cputime.Process()-cpu
	return r, nil
}

// ServeSlave runs s (modbus.TimingFor at the line's baud rate) on drop i
// until ctx ends: the fast Go slave on the line. The channel gets
// ServeRTU's result; the caller cancels ctx and waits for it.
func (l *RS485) ServeSlave(ctx context.Context, i int, s *legacy.Slave) (<-chan error, error) {
	if i < 0 || i >= len(l.Drops) {
		return nil, fmt.Errorf("%w: no drop %d (have %d)", ErrLineConfig, i, len(l.Drops))
	}
	f, err := os.OpenFile(l.Drops[i], os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: rs485 drop %d: %w", i, err)
	}
	if s.Baud == 0 {
		s.Baud = l.cfg.Baud
	}
	done := make(chan error, 1)
	go func() {
		err := s.ServeRTU(ctx, f)
		if cerr := f.Close(); err == nil && !errors.Is(cerr, os.ErrClosed) {
			err = cerr
		}
		done <- err
	}()
	return done, nil
}
