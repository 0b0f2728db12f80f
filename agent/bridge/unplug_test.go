package bridge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// cable is a USB-serial adapter the test can unplug and plug back: the
// bridge opens a stable symlink (like /dev/serial/by-id/...), and each plug
// is a new pty whose master the same device (registers and its transaction
// memory) serves.
type cable struct {
	t    *testing.T
	link string
	dev  *legacy.Registers
	resp *serial.Responder

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	master *os.File
	slave  *os.File
}

// plug may run on any goroutine: it reports failures with t.Error.
func (c *cable) plug() {
	master, s, err := sandbox.OpenPty()
	if err != nil {
		c.t.Error(err)
		return
	}
	tmp := c.link + ".new"
	if err := os.Symlink(s.Name(), tmp); err != nil {
		c.t.Error(err)
		return
	}
	if err := os.Rename(tmp, c.link); err != nil {
		c.t.Error(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.resp.Serve(ctx, master)
	}()
	c.mu.Lock()
	c.cancel, c.done, c.master, c.slave = cancel, done, master, s
	c.mu.Unlock()
}

func (c *cable) unplug() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil {
		return
	}
	os.Remove(c.link)
	c.cancel()
	c.master.Close()
	<-c.done
	c.slave.Close()
	c.cancel = nil
}

// TestUnplugReplugMidStream: commands keep arriving while the adapter is
// unplugged and plugged back twice; every command is answered accepted and
// applied exactly once, in order.
func TestUnplugReplugMidStream(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	var applied syncBuffer
	c := &cable{t: t, link: filepath.Join(dir, "ttyUSB0"), dev: legacy.NewRegisters("plc-u", 64, &applied)}
	c.resp = &serial.Responder{Handler: c.dev.Handle}
	c.plug()
	defer c.unplug()

	tbl, err := fence.OpenTable(filepath.Join(dir, "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Close()
	br, err := New(Config{Table: tbl, Topics: r.topics, CommandTimeout: 60 * time.Second,
		Devices: []Device{{ID: "plc-u", Port: serial.PortConfig{Path: c.link}}}})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "home-u",
		CleanStart: true, Subscriptions: br.Subscriptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(mc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := mc.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background(), mc); err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "holder-u", CleanStart: true},
		r.topics, []string{"plc-u"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)

	const n = 30
	for i := 1; i <= n; i++ {
		switch i {
		case 10, 20:
			c.unplug()
			// Replug after the next command is on its way: it waits for the port.
			go func() {
				time.Sleep(200 * time.Millisecond)
				c.plug()
			}()
		}
		body, _ := fence.EncodeBody(map[string]any{"addr": i, "value": 1000 + i})
		ack, err := cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: "plc-u", Token: 8, Seq: uint64(i),
			ID: fmt.Sprintf("u%d", i), Kind: modbus.KindWriteRegister, Body: body})
		if err != nil || ack.Verdict != fence.Accepted {
			t.Fatalf("command %d: %+v %v", i, ack, err)
		}
	}
	log := applied.applied(t)
	if len(log) != n {
		t.Fatalf("%d writes applied for %d commands", len(log), n)
	}
	for i, a := range log {
		if int(a.Addr) != i+1 || int(a.Values[0]) != 1001+i {
			t.Fatalf("write %d: %+v", i, a)
		}
	}
	if st := br.Stats(); st.Accepted != n || st.SerialErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}
