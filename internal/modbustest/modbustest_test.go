package modbustest

import (
	"slices"
	"strings"
	"testing"
)

// The guard of Require: what is missing is named.
func TestMissingNamesWhatIsMissing(t *testing.T) {
	err := missing("/nonexistent/python3", "edgefence-no-such-tool", "sh")
	if err == nil || !strings.Contains(err.Error(), "pymodbus not importable by /nonexistent/python3") ||
		!strings.Contains(err.Error(), "edgefence-no-such-tool not found") || strings.Contains(err.Error(), "sh not found") {
		t.Fatalf("missing: %v", err)
	}
}

// The harness itself: a slave as documented, reached by mbpoll over TCP
// and over a pty pair, and the same registers after a restart of the
// slave (back to their initial values).
func TestSlaveWithMbpoll(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pymodbus")
	}
	tcp := StartTCP(t, Options{Units: []byte{3, 7}, Size: 10})
	rtuPair := NewPtyPair(t)
	rtu := StartRTU(t, rtuPair.A, Options{Units: []byte{7}, Baud: 9600, Parity: "E"})
	for _, g := range []Target{tcp.TCPTarget(), {Path: rtuPair.B, Baud: 9600, Parity: "E"}} {
		if got := MbpollRead(t, g, 7, HoldingRegisters, 2, 3); !slices.Equal(got, []uint16{Initial(7, 2), Initial(7, 3), Initial(7, 4)}) {
			t.Fatalf("%+v: holding registers %v", g, got)
		}
		if got := MbpollRead(t, g, 7, InputRegisters, 0, 1); got[0] != Initial(7, 0) {
			t.Fatalf("%+v: input register %v", g, got)
		}
		if got := MbpollRead(t, g, 7, DiscreteInputs, 0, 3); !slices.Equal(got, []uint16{1, 0, 1}) {
			t.Fatalf("%+v: discrete inputs %v", g, got)
		}
		MbpollWrite(t, g, 7, HoldingRegisters, 1, 65000, 2)
		MbpollWrite(t, g, 7, Coils, 4, 1)
		if got := MbpollRead(t, g, 7, HoldingRegisters, 1, 2); !slices.Equal(got, []uint16{65000, 2}) {
			t.Fatalf("%+v: written registers read back %v", g, got)
		}
		if got := MbpollRead(t, g, 7, Coils, 3, 3); !slices.Equal(got, []uint16{0, 1, 0}) {
			t.Fatalf("%+v: written coil read back %v", g, got)
		}
	}
	if got := MbpollRead(t, tcp.TCPTarget(), 3, HoldingRegisters, 9, 1); got[0] != Initial(3, 9) {
		t.Fatalf("unit 3: %v", got)
	}
	tcp.Restart(t)
	rtu.Restart(t)
	if got := MbpollRead(t, tcp.TCPTarget(), 7, HoldingRegisters, 1, 1); got[0] != Initial(7, 1) {
		t.Fatalf("after a restart: %v", got)
	}
	if got := MbpollRead(t, Target{Path: rtuPair.B, Baud: 9600, Parity: "E"}, 7, HoldingRegisters, 1, 1); got[0] != Initial(7, 1) {
		t.Fatalf("RTU after a restart: %v", got)
	}
}
