package bridge

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/modbustest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
	"github.com/edgefence/edgefence/transport/mqtt"
	"github.com/edgefence/edgefence/transport/serial"
)

// The Modbus tests run the bridge against pymodbus (Debian's
// python3-pymodbus, a Modbus implementation nobody here wrote) over TCP on
// 127.0.0.1 or RTU on a pty pair, and read the slave back with mbpoll.

// mbRig is a bridge whose devices are Modbus units, with a holder's
// Commander on the same broker.
type mbRig struct {
	t      testing.TB
	topics mqtt.Topics
	broker *sandbox.Broker
	cmdr   *mqtt.Commander
	br     *Bridge
	stop   func()
}

func hvacProfile(t testing.TB) *profile.Profile {
	t.Helper()
	p, err := profile.Load(filepath.Join("..", "..", "configs", "profiles", "hvac-controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startMbRig starts a broker, the holder's Commander for devs' ids and a
// bridge over tbl with buses and devs.
func startMbRig(t testing.TB, tbl Table, buses []Bus, devs []Device) *mbRig {
	t.Helper()
	return startMbRigWith(t, Config{Table: tbl, Buses: buses, Devices: devs})
}

// startMbRigWith is startMbRig with cfg's Table, Buses, Devices and
// CommandTimeout (default 10s here).
func startMbRigWith(t testing.TB, cfg Config) *mbRig {
	t.Helper()
	tbl, devs := cfg.Table, cfg.Devices
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r := &mbRig{t: t, topics: mqtt.Topics{Prefix: "mb-test"}, broker: b}
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.ID
	}
	r.cmdr, err = mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "holder", CleanStart: true}, r.topics, ids)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCtx(r.cmdr.Close) })
	cfg.Topics = r.topics
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = 10 * time.Second
	}
	br, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.br, r.stop = br, runBridge(t, b.URL(), br, tbl)
	return r
}

func (r *mbRig) send(dev string, tok fence.Token, seq uint64, kind string, body []byte) *fence.Ack {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ack, err := r.cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: dev, Token: tok, Seq: seq, Holder: "gw",
		ID: dev + "-" + itoa(int(tok)) + "-" + itoa(int(seq)), Kind: kind, Body: body})
	if err != nil {
		r.t.Fatalf("send to %s: %v", dev, err)
	}
	return ack
}

func twinSet(t testing.TB, fields map[string]any) []byte {
	t.Helper()
	b, err := shadow.EncodeCBOR(fields, shadow.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rawWrite(t testing.TB, addr, value uint16) []byte {
	t.Helper()
	b, err := fence.EncodeBody(map[string]any{"addr": addr, "value": value})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Figure 1 on a real Modbus slave: holder A (token 7) sets the
// thermostat, B (token 9) takes over and sets it, A's late twin.set
// arrives. The table refuses it before the bus: the slave's register keeps
// B's value, as mbpoll (an independent master) reads it. With the table
// off (a test build), A's late write lands: the test would fail without
// the fence.
func TestModbusFrozenHolderRefusedBeforeTheBus(t *testing.T) {
	modbustest.Require(t)
	for _, fenced := range []bool{true, false} {
		name := map[bool]string{true: "fenced", false: "table off"}[fenced]
		t.Run(name, func(t *testing.T) {
			if !fenced && !unsafeBuild {
				t.Skip("the table-off contrast needs -tags edgefence_unsafe")
			}
			slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{5}})
			var tbl Table
			var err error
			if fenced {
				tbl, err = fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
			} else {
				tbl, err = NoTable(nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := startMbRig(t, tbl, []Bus{{BusConfig: modbus.BusConfig{Name: "plc-net", TCP: slave.Addr()}, Retries: 2}},
				[]Device{{ID: "tc-1", Modbus: &ModbusUnit{Bus: "plc-net", Unit: 5, Profile: hvacProfile(t)}}})
			if a := r.send("tc-1", 7, 1, KindTwinSet, twinSet(t, map[string]any{"setpoint": 20.5})); a.Verdict != fence.Accepted {
				t.Fatalf("A: %+v", a)
			}
			if a := r.send("tc-1", 9, 1, KindTwinSet, twinSet(t, map[string]any{"setpoint": 22.0, "mode": "heat"})); a.Verdict != fence.Accepted {
				t.Fatalf("B: %+v", a)
			}
			late := r.send("tc-1", 7, 2, KindTwinSet, twinSet(t, map[string]any{"setpoint": 30.0}))
			got := modbustest.MbpollRead(t, slave.TCPTarget(), 5, modbustest.HoldingRegisters, 0, 2)
			if !fenced {
				if late.Verdict != fence.Accepted || got[0] != 300 {
					t.Fatalf("table off: late %+v, register %d: the stale write should have landed", late, got[0])
				}
				return
			}
			if late.Verdict != fence.Stale || late.MaxToken != 9 {
				t.Fatalf("A late: %+v", late)
			}
			if got[0] != 220 || got[1] != 1 {
				t.Fatalf("slave holds setpoint %d mode %d, want B's 220 and 1 (heat)", got[0], got[1])
			}
			if st := r.br.Stats(); st.Accepted != 2 || st.Stale != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Several units on one RS-485 line (each slave on its drop), one of them
// dead: the live ones are served in order, each command to the dead one
// ends Unknown after its timeout (an absolute write is retried, an alarm
// pulse is not: it was sent once), and an exception is Invalid with its
// name. Then a live unit goes absent (its drop cut): its commands end
// Unknown and reach nothing, the other unit is served meanwhile, and once
// connected again it is served.
func TestModbusUnitsOnOneBusOneDead(t *testing.T) {
	modbustest.Require(t)
	line := startLine(t, 2)
	modbustest.StartRTU(t, line.Drops[0], modbustest.Options{Units: []byte{1}, Baud: 19200})
	slave2 := modbustest.StartRTU(t, line.Drops[1], modbustest.Options{Units: []byte{2}, Baud: 19200, WriteLog: true})
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Unpolled: the dead unit's polls would time out on the bus too, and
	// the bus's counters must show the pulse's one timeout.
	hvac, err := hvacUnpolled()
	if err != nil {
		t.Fatal(err)
	}
	bus := Bus{BusConfig: modbus.BusConfig{Name: "rs485-1", RTU: &serial.PortConfig{Path: line.Master, Baud: 19200}, Timeout: 300 * time.Millisecond}, Retries: 2}
	r := startMbRig(t, tbl, []Bus{bus}, []Device{
		{ID: "plc-1", Modbus: &ModbusUnit{Bus: "rs485-1", Unit: 1}},
		{ID: "tc-2", Modbus: &ModbusUnit{Bus: "rs485-1", Unit: 2, Profile: hvac}},
		{ID: "tc-3", Modbus: &ModbusUnit{Bus: "rs485-1", Unit: 3, Profile: hvac}}, // nobody answers unit 3
	})
	var wg sync.WaitGroup
	acks := make(map[string][]*fence.Ack)
	var mu sync.Mutex
	for _, dev := range []string{"plc-1", "tc-2", "tc-3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); seq <= 3; seq++ {
				var a *fence.Ack
				if dev == "plc-1" {
					a = r.send(dev, 4, seq, modbus.KindWriteRegister, rawWrite(t, 10, uint16(100+seq)))
				} else {
					a = r.send(dev, 4, seq, KindTwinSet, twinSet(t, map[string]any{"setpoint": 18 + float64(seq)}))
				}
				mu.Lock()
				acks[dev] = append(acks[dev], a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, dev := range []string{"plc-1", "tc-2"} {
		for _, a := range acks[dev] {
			if a.Verdict != fence.Accepted {
				t.Errorf("%s: %+v", dev, a)
			}
		}
	}
	for _, a := range acks["tc-3"] {
		if a.Verdict != fence.Unknown || !strings.Contains(a.Reason, "fate unknown") {
			t.Errorf("dead unit: %+v", a)
		}
	}
	before := r.br.Buses()[0].Stats.Timeouts
	// A pulse to the dead unit: not idempotent, sent once, never again.
	a := r.send("tc-3", 4, 4, "ack_alarm", nil)
	after := r.br.Buses()[0].Stats.Timeouts
	if a.Verdict != fence.Unknown || !strings.Contains(a.Reason, "not idempotent") || after-before != 1 {
		t.Errorf("pulse to the dead unit: %+v; %d timeouts (want 1: sent once)", a, after-before)
	}
	// An exception from a live unit: invalid, named.
	a = r.send("plc-1", 4, 4, modbus.KindWriteRegister, rawWrite(t, 5000, 1))
	if a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "illegal data address") {
		t.Errorf("exception: %+v", a)
	}
	units := r.br.Units()
	if len(units) != 3 || units[2].Device != "tc-3" || units[2].LastError == "" {
		t.Errorf("units %+v", units)
	}

	// Unit 2 goes absent: its drop is cut from the line.
	must(t, line.Cut(1, true))
	applied := len(slave2.Writes(t))
	gone := make(chan []*fence.Ack, 1)
	go func() {
		gone <- []*fence.Ack{r.send("tc-2", 4, 4, KindTwinSet, twinSet(t, map[string]any{"setpoint": 25.0})), r.send("tc-2", 4, 5, "ack_alarm", nil)}
	}()
	for seq := uint64(5); seq <= 7; seq++ { // unit 1 is served meanwhile
		if a := r.send("plc-1", 4, seq, modbus.KindWriteRegister, rawWrite(t, 11, uint16(100+seq))); a.Verdict != fence.Accepted {
			t.Errorf("plc-1 while unit 2 is cut: %+v", a)
		}
	}
	cut := <-gone
	wantAck(t, "setpoint to the cut unit", cut[0], fence.Unknown, "no answer after 3 attempts")
	wantAck(t, "pulse to the cut unit", cut[1], fence.Unknown, "not idempotent")
	if ws := slave2.Writes(t); len(ws) != applied {
		t.Errorf("the cut unit applied %+v", ws[applied:])
	}
	must(t, line.Cut(1, false))
	wantAck(t, "unit 2 connected again", r.send("tc-2", 4, 6, KindTwinSet, twinSet(t, map[string]any{"setpoint": 26.0})), fence.Accepted, "")

	r.stop() // free the line for mbpoll
	master := modbustest.Target{Path: line.Master}
	if v := modbustest.MbpollRead(t, master, 1, modbustest.HoldingRegisters, 10, 2); v[0] != 103 || v[1] != 107 {
		t.Errorf("unit 1 registers 10, 11 = %v, want 103, 107", v)
	}
	if v := modbustest.MbpollRead(t, master, 2, modbustest.HoldingRegisters, 0, 1); v[0] != 260 {
		t.Errorf("unit 2 setpoint = %d, want 260", v[0])
	}
}

// A Modbus device with a profile is polled: its reported fields reach the
// state topic as a state report (shadow CBOR), decoded by the profile.
func TestModbusPollReportsFields(t *testing.T) {
	modbustest.Require(t)
	trust, gw := gatewayKey(t)
	slave := modbustest.StartTCP(t, modbustest.Options{Units: []byte{2}})
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The home gateway signs its devices' reports (I7): a holder takes
	// them only verified against the gateway's certificate, bound to the
	// device and to the table's mark.
	type report struct {
		mark   fence.Mark
		fields map[string]any
	}
	reports := make(chan report, 64)
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	topics := mqtt.Topics{Prefix: "mb-poll"}
	watch, err := mqtt.Dial(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "twin-watch", CleanStart: true,
		Subscriptions: []mqtt.Subscription{{Filter: topics.State("plc-2"), Handler: func(m mqtt.Message) {
			v, err := auth.VerifyState(m.Payload, auth.GatewayAcks{Keys: trust})
			if err != nil || v.Report.Device != "plc-2" {
				t.Errorf("state report: %v", err)
				return
			}
			if f, err := shadow.DecodeCBOR(v.Report.State, shadow.Limits{}); err == nil {
				reports <- report{v.Report.Mark(), f}
			}
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(watch.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := watch.AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	br, err := New(Config{Table: tbl, Topics: topics, Signer: gw, Buses: []Bus{{BusConfig: modbus.BusConfig{Name: "net", TCP: slave.Addr()}}},
		Devices: []Device{{ID: "plc-2", Modbus: &ModbusUnit{Bus: "net", Unit: 2, Profile: hvacProfile(t)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer runBridge(t, b.URL(), br, tbl)()
	seen := map[string]any{}
	for len(seen) < 5 {
		select {
		case r := <-reports:
			for k, v := range r.fields {
				seen[k] = v
			}
		case <-ctx.Done():
			t.Fatalf("reported so far: %v", seen)
		}
	}
	// pymodbus starts register a of unit u at u<<8|a: input 0 is 512, ×0.1.
	if v, ok := seen["room_temperature"].(float64); !ok || v != 51.2 {
		t.Errorf("room_temperature %v (%T), want 51.2; all %v", seen["room_temperature"], seen["room_temperature"], seen)
	}
	// A holder commands the device: the reports after it carry the new
	// mark, and every field again (a new holder's token).
	cmdr, err := mqtt.NewCommander(context.Background(), mqtt.Config{Brokers: []string{b.URL()}, ClientID: "holder", CleanStart: true}, topics, []string{"plc-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeCtx(cmdr.Close)
	if a, err := cmdr.Send(ctx, &fence.Envelope{V: fence.Version, Device: "plc-2", Token: 8, Seq: 1, ID: "s1", Kind: KindTwinSet,
		Body: twinSet(t, map[string]any{"setpoint": 21.0})}); err != nil || a.Verdict != fence.Accepted {
		t.Fatalf("twin.set: %+v %v", a, err)
	}
	// Every field again at the next poll (the alarm's, every second), well
	// before the periodic full report (fullReportEvery after the first);
	// the setpoint register is polled every 10 s: its new value follows.
	full, setpoint := false, false
	fullBy := time.After(fullReportEvery / 2)
	setpointBy := time.After(60 * time.Second)
	for !full || !setpoint {
		select {
		case r := <-reports:
			if r.mark != (fence.Mark{Token: 8, Seq: 1}) {
				continue
			}
			full = full || len(r.fields) >= 5
			setpoint = setpoint || r.fields["setpoint"] == 21.0
		case <-fullBy:
			if !full {
				t.Fatalf("no full report within %v of a new holder's command", fullReportEvery/2)
			}
		case <-setpointBy:
			t.Fatal("the new setpoint was never reported")
		}
	}
	st := br.Buses()[0]
	if st.Polls == 0 || st.PollCap != DefaultPollUtilisation {
		t.Errorf("bus %+v", st)
	}
	if u := br.Units()[0]; u.LastPoll.IsZero() || u.Profile != "acme-tc20" {
		t.Errorf("unit %+v", u)
	}
}

// Bad bus configs are refused at New, naming the problem.
func TestModbusConfigRefused(t *testing.T) {
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Close()
	ok := Bus{BusConfig: modbus.BusConfig{Name: "b", TCP: "127.0.0.1:1"}}
	for name, c := range map[string]Config{
		"no bus":      {Devices: []Device{{ID: "d", Modbus: &ModbusUnit{Bus: "x", Unit: 1}}}},
		"unit 0":      {Buses: []Bus{ok}, Devices: []Device{{ID: "d", Modbus: &ModbusUnit{Bus: "b", Unit: 0}}}},
		"unit 248":    {Buses: []Bus{ok}, Devices: []Device{{ID: "d", Modbus: &ModbusUnit{Bus: "b", Unit: 248}}}},
		"same unit":   {Buses: []Bus{ok}, Devices: []Device{{ID: "d", Modbus: &ModbusUnit{Bus: "b", Unit: 1}}, {ID: "e", Modbus: &ModbusUnit{Bus: "b", Unit: 1}}}},
		"two buses":   {Buses: []Bus{ok, ok}},
		"rtu and tcp": {Buses: []Bus{{BusConfig: modbus.BusConfig{Name: "b", TCP: "x:1", RTU: &serial.PortConfig{Path: "/dev/null"}}}}},
		"cap":         {Buses: []Bus{{BusConfig: ok.BusConfig, PollUtilisation: 1.5}}},
	} {
		c.Table = tbl
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The poll gate keeps polls to their share of the bus: after a poll of d
// that started at s, the next may start at s + d/share, so polls back to
// back use exactly the share; a poll waiting for the gate gives the token
// back when its context ends.
func TestPollGateCap(t *testing.T) {
	for _, share := range []float64{1, 0.5, 0.25, 0.1} {
		m := &mbBus{cfg: Bus{PollUtilisation: share}, gate: make(chan time.Time, 1)}
		start, d := time.Unix(1000, 0), 40*time.Millisecond
		var busy time.Duration
		for range 10 {
			m.giveGate(start, d)
			busy += d
			start = <-m.gate
		}
		if got := float64(busy) / float64(start.Sub(time.Unix(1000, 0))); math.Abs(got-share) > 1e-9 {
			t.Errorf("share %g: polls took %g of the time", share, got)
		}
		if m.polls != 10 || m.pollBusy != busy {
			t.Errorf("share %g: counted %d polls, %v", share, m.polls, m.pollBusy)
		}
	}
	m := &mbBus{cfg: Bus{PollUtilisation: 0.5}, gate: make(chan time.Time, 1)}
	next := time.Now().Add(time.Hour)
	m.gate <- next
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if m.takeGate(ctx) {
		t.Fatal("took the gate an hour early")
	}
	if got := <-m.gate; !got.Equal(next) {
		t.Fatalf("token back with %v, want %v", got, next)
	}
}
