package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/serial"
)

// The line's limit by hand: 8N1 is 10 bits a character; t3.5 is 3.5
// characters of 11 bits up to 19,200 baud, then 1.75 ms.
func TestRTULimit(t *testing.T) {
	for _, c := range []struct {
		baud, req, rsp int
		want           time.Duration
	}{
		{9600, 8, 7, 2*(11*time.Second/9600)*7/2 + 15*time.Second*10/9600},
		{115200, 8, 8, 2*1750*time.Microsecond + 16*time.Second*10/115200},
	} {
		got, err := RTULimit(c.baud, time.Second*10/time.Duration(c.baud), c.req, c.rsp)
		if err != nil || (got-c.want).Abs() > time.Microsecond {
			t.Errorf("%d baud: %v %v, want %v", c.baud, got, err, c.want)
		}
	}
	if _, err := RTULimit(0, time.Millisecond, 8, 8); err == nil {
		t.Error("baud 0 accepted")
	}
}

// A few transactions through MeasureLineRate with the Go slave on a drop:
// counted, no errors, a rate below the line's limit; a drop that is not
// there is refused.
func TestMeasureLineRate(t *testing.T) {
	l, err := NewRS485(RS485Config{Baud: 115200, Drops: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.BitsPerChar() != 10 {
		t.Errorf("8N1: %d bits a character", l.BitsPerChar())
	}
	if _, err := l.ServeSlave(context.Background(), 1, &legacy.Slave{}); !errors.Is(err, ErrLineConfig) {
		t.Errorf("drop 1 of 1: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := l.ServeSlave(ctx, 0, &legacy.Slave{Units: legacy.Units{1: legacy.NewRegisters("u1", 8, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	bus, err := modbus.OpenBus(modbus.BusConfig{RTU: &serial.PortConfig{Path: l.Master, Baud: 115200}})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	r, err := l.MeasureLineRate(ctx, bus, 1, &modbus.Request{Func: modbus.FuncReadHolding, Count: 1}, "read1", 20)
	if err != nil || r.N != 20 || r.Errors != 0 || r.ReqBytes != 8 || r.RspBytes != 7 || r.Ratio() <= 0 || r.Ratio() > 1.01 {
		t.Fatalf("%+v (ratio %.2f): %v", r, r.Ratio(), err)
	}
	t.Logf("%.0f tx/s, limit %.0f, ratio %.2f", r.TxPerSec(), r.LimitTxPerSec(), r.Ratio())
}
