package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefence/edgefence/transport/mqtt"
)

// oversizePayload is the publish of issue 13 that took the agent to 621 MB
// RSS, for good.
const oversizePayload = 200 << 20

// rssSlack is how far a 200 MB publish may move a process's peak RSS
// (VmHWM): a few MB of noise, far below the payload.
const rssSlack = 8 << 20

// agentMaxPacketSize is the agent's mqtt.max_packet_size in these tests,
// not the default, so that the key is seen to reach the client.
const agentMaxPacketSize = 96 << 10

// TestOversizePublish sends a 200 MB message to the agent's ack topic and
// to a device's command topic, the real binaries (edgefence run,
// edgefence-devsim) subscribed: on Mosquitto 2.0, which honours the
// clients' Maximum Packet Size (CONNECT) and drops the message for them,
// and on mochi made to ignore it, where the clients drop it themselves,
// unread, and count it. Either way neither process's peak RSS moves by more
// than rssSlack, both stay connected, and a command round trip still
// succeeds. (mochi as it is honours the limit too: transport/mqtt's
// TestOversizeMessage; over 200 MB it only makes this test a minute longer.)
func TestOversizePublish(t *testing.T) {
	for _, tc := range []struct {
		name    string
		broker  func(t *testing.T) string
		counted uint64 // packets each client drops itself
	}{
		{"mochi ignoring the limit", func(t *testing.T) string {
			return startBroker(t, BrokerConfig{Setup: func(s *mochi.Server) error { return s.AddHook(new(ignoreMaxPacketSize), nil) }}).URL()
		}, 1},
		{"mosquitto", func(t *testing.T) string { return startMosquitto(t).URL() }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { runOversize(t, tc.broker(t), tc.counted) })
	}
}

func runOversize(t *testing.T, brokerURL string, counted uint64) {
	agentBin, devsimBin := binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	e := startEtcd(t, EtcdConfig{Fast: true})
	dir, dev := t.TempDir(), "dev-1"
	f := &figure1{cfg: Figure1Config{AgentBin: agentBin, Devices: []string{dev}}}
	defer f.stopAll()

	devsim, err := StartProc("devsim", filepath.Join(dir, "devsim.log"), nil, devsimBin, "--mqtt", brokerURL,
		"--devices", dev, "--dir", filepath.Join(dir, "devices"), "--log", filepath.Join(dir, "verdicts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	f.procs = append(f.procs, devsim)
	if err := devsim.WaitLine(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	ac := AgentConfig{Gateway: "gw-a", Etcd: e.Endpoint(), MQTT: brokerURL, Devices: []string{dev},
		Socket: filepath.Join(dir, "gw-a.sock"), StateDir: filepath.Join(dir, "gw-a-state"), MQTTMaxPacketSize: agentMaxPacketSize,
		// A broker under the race detector takes its time over 200 MB,
		// and the command after them waits behind them.
		CommandTimeout: 2 * time.Minute}
	if err := ac.Write(filepath.Join(dir, "gw-a.yaml")); err != nil {
		t.Fatal(err)
	}
	agent, err := StartProc("gw-a", filepath.Join(dir, "gw-a.log"), nil, agentBin, "run", "--config", filepath.Join(dir, "gw-a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f.procs = append(f.procs, agent)
	held, err := f.waitHolding(ctx, agent, ac.Socket)
	if err != nil {
		t.Fatal(err)
	}
	tok := held[dev]
	roundTrip := func(setpoint float64, verdicts ...string) {
		t.Helper()
		res, err := f.send(ctx, ac.Socket, dev, setpoint)
		// A loaded machine can keep the agent's keep-alive answers back
		// past its lease while the flood drains (not what this test is
		// about): wait until it holds again and send once more.
		for try := 0; try < 3 && err == nil && strings.Contains(res.Error, "not the lease holder"); try++ {
			t.Logf("send %g: the agent lost the lease (%s); waiting until it holds again", setpoint, res.Error)
			if _, err := f.waitHolding(ctx, agent, ac.Socket); err != nil {
				t.Fatal(err)
			}
			res, err = f.send(ctx, ac.Socket, dev, setpoint)
		}
		if err != nil || !slices.Contains(verdicts, res.Verdict) {
			t.Fatalf("send %g: %+v, %v; want %v", setpoint, res, err, verdicts)
		}
	}
	roundTrip(21, "accepted")
	before := map[string]procMem{"agent": readProcMem(t, agent.Pid()), "devsim": readProcMem(t, devsim.Pid())}

	// A plain paho client, as anyone on the broker could run, given a
	// minute for the PUBACK: an in-process mochi under the race detector
	// takes more than paho's default 10s over 200 MB.
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	forger := mqttClient(t, ctx, u.Host, "forger", nil, func(c *paho.ClientConfig) { c.PacketTimeout = time.Minute })
	topics, payload := mqtt.Topics{}, make([]byte, oversizePayload)
	for _, topic := range []string{topics.Ack(dev), topics.Cmd(dev)} {
		start := time.Now()
		if _, err := forger.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload}); err != nil {
			t.Fatalf("publish %d MB to %s: %v", oversizePayload>>20, topic, err)
		}
		t.Logf("published %d MB to %s in %v", oversizePayload>>20, topic, time.Since(start).Round(time.Millisecond))
	}

	// The broker delivers (or drops) in order: the round trip's command and
	// ack come after the big messages on the same subscriptions. (mochi
	// sends its PUBACK just before it queues a message for the
	// subscribers: the waits below cover that.) Behind a big message that
	// mochi is still writing under the race detector, the command can
	// outlast the agent's first resend (1 s): then the device applies the
	// first copy and the agent records its verdict on the resend,
	// duplicate — applied once all the same.
	// Under the whole suite, the flood through this process's own broker
	// and etcd (both under the race detector) once kept the agent's
	// keep-alive answers back past its lease (make test, 14:27 UTC on
	// 2026-12-03: "not the lease holder"); alone it passes. The lease is
	// not what this test is about: wait until the agent holds again, and
	// say so if it had lost it.
	if toks, err := f.waitHolding(ctx, agent, ac.Socket); err != nil {
		t.Fatal(err)
	} else if toks[dev] != tok {
		t.Logf("the agent lost %s's lease during the flood and took it again (token %d → %d)", dev, tok, toks[dev])
	}
	roundTrip(22, "accepted", "duplicate")
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if counted > 0 {
		if err := devsim.WaitLine(wctx, "mqtt message over the maximum packet size; dropped"); err != nil {
			t.Error(err)
		}
	}
	err = f.waitStatus(wctx, agent, ac.Socket, fmt.Sprintf("count %d oversize packets", counted), func(st *agentStatus) bool {
		return st.Transport["packets_oversize"] == float64(counted)
	})
	if err != nil {
		t.Error(err)
	}
	for name, p := range map[string]*Proc{"agent": agent, "devsim": devsim} {
		after := readProcMem(t, p.Pid())
		t.Logf("%s: VmHWM %d → %d kB, VmRSS %d → %d kB", name, before[name].hwm>>10, after.hwm>>10, before[name].rss>>10, after.rss>>10)
		if grew := after.hwm - before[name].hwm; grew > rssSlack {
			t.Errorf("%s: peak RSS grew %d MB with a %d MB publish", name, grew>>20, oversizePayload>>20)
		}
	}
	st, err := f.status(ctx, ac.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if st.Transport["connected"] != true || st.Transport["reconnects"] != float64(0) || st.Transport["max_packet_size"] != float64(agentMaxPacketSize) {
		t.Errorf("agent transport after the big messages: %v", st.Transport)
	}
	// devsim counts what its client dropped: it says so when it stops.
	// Then its whole log has been read: WaitLine on a done context says
	// whether a line is in it.
	if err := devsim.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if err := devsim.WaitLine(done, fmt.Sprintf("mqtt_packets_oversize=%d", counted)); err != nil {
		t.Error(err)
	}
	if devsim.WaitLine(done, "mqtt connection lost") == nil {
		t.Error("devsim lost its broker connection")
	}
}

// procMem is a process's resident memory, bytes.
type procMem struct{ rss, hwm int64 }

// readProcMem reads VmRSS and VmHWM (the peak) from /proc/PID/status.
func readProcMem(t *testing.T, pid int) procMem {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m procMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.rss = n << 10
		case "VmHWM":
			m.hwm = n << 10
		}
	}
	if m.rss == 0 || m.hwm == 0 {
		t.Fatalf("no VmRSS/VmHWM in /proc/%d/status", pid)
	}
	return m
}

// ignoreMaxPacketSize makes mochi send packets of any size, whatever
// Maximum Packet Size the client asked for: a broker that ignores it.
type ignoreMaxPacketSize struct{ mochi.HookBase }

func (h *ignoreMaxPacketSize) ID() string           { return "ignore-max-packet-size" }
func (h *ignoreMaxPacketSize) Provides(b byte) bool { return b == mochi.OnPacketEncode }

// OnPacketEncode runs after mochi set Mods.MaxSize from the client's
// CONNECT; 0 is no limit.
func (h *ignoreMaxPacketSize) OnPacketEncode(_ *mochi.Client, pk packets.Packet) packets.Packet {
	pk.Mods.MaxSize = 0
	return pk
}
