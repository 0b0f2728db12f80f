package legacy

import (
	"errors"
	"log/slog"
	"sync/atomic"
)

// ErrBlockingPort refuses a port whose reads ignore deadlines (a blocking
// file descriptor): ServeRTU could neither see a silence inside a frame
// nor stop when its context ends.
var ErrBlockingPort = errors.New("legacy: port reads ignore deadlines (blocking file descriptor)")

// Units are the register devices one simulated Modbus slave answers for,
// by unit id: several units on one line, as on an RS-485 bus.
type Units map[byte]*Registers

// SlaveStats counts a simulated slave's frames.
type SlaveStats struct {
	Requests  uint64 // frames addressed to one of its units, answered
	Broadcast uint64 // frames to unit 0: writes applied, nothing answered
	Foreign   uint64 // frames to other units: ignored, as on a bus
	Bad       uint64 // frames dropped: CRC error, cut by a silence, malformed
}

// Slave is a simulated Modbus RTU or TCP server for Units: it has no fence,
// like the field devices it stands in for. Tests and the sandbox use it
// where a fast peer is wanted (the line-rate benchmarks, the demo); the
// proofs use pymodbus, which nobody here wrote. Its fields are read when
// a Serve method starts; one Slave may serve several ports at once.
type Slave struct {
	Units Units
	// Baud sets the RTU silences (modbus.TimingFor): the wait before an
	// answer, t3.5, and the silence that drops an unfinished frame; 0
	// means 19,200.
	Baud int
	// Logger gets a debug line for every frame dropped; nil discards.
	Logger *slog.Logger

	requests, broadcast, foreign, bad atomic.Uint64
}

// Stats returns the slave's counters.
func (s *Slave) Stats() SlaveStats {
	return SlaveStats{Requests: s.requests.Load(), Broadcast: s.broadcast.Load(), Foreign: s.foreign.Load(), Bad: s.bad.Load()}
}

func (s *Slave) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// dropped counts and logs a bad frame.
func (s *Slave) dropped(log *slog.Logger, why string, frame []byte) {
	s.bad.Add(1)
	log.Debug("modbus slave dropped a frame", "why", why, "bytes", len(frame), "frame", frame)
}
