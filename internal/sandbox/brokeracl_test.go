package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestBrokerACL runs the real agent (gateway gw-a) and real devsim devices
// (thermostat-1, thermostat-2, each logged in as itself) on a broker that
// applies deploy/mosquitto/edgefence.acl: Debian's Mosquitto configured
// with deploy/mosquitto/edgefence.conf and a password file hashed by
// mosquitto_passwd, and the sandbox's mochi broker with the same ACL file.
// Every publish of the ACL's cases gets the broker's answer the file
// promises; a command round trip works; a client holding thermostat-1's
// credentials cannot command thermostat-2 (its device never sees the
// forged command, whose huge token would have locked the agent out) nor
// forge thermostat-2's ack (the agent never receives it); anonymous clients
// and wrong passwords are refused; the read-only operator user subscribed
// to every topic sees the round trip's command, ack and state, and every
// publish of its is refused. The control subtest runs the same attack on a
// broker whose ACL lets everyone do everything, and sees it land.
func TestBrokerACL(t *testing.T) {
	agentBin, devsimBin := binaries(t)
	acl := deployACL(t)
	t.Run("mosquitto", func(t *testing.T) { aclWorld(t, agentBin, devsimBin, "mosquitto", acl, true) })
	t.Run("mochi", func(t *testing.T) { aclWorld(t, agentBin, devsimBin, "mochi", acl, true) })
	t.Run("control", func(t *testing.T) {
		aclWorld(t, agentBin, devsimBin, "mochi", "pattern readwrite edgefence/v1/#\n", false)
	})
}

// aclTarget is the device the attacker, holding aclAttacker's credentials,
// goes after.
const (
	aclAttacker = "thermostat-1"
	aclTarget   = "thermostat-2"
)

func aclWorld(t *testing.T, agentBin, devsimBin, kind, acl string, enforced bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	auth, err := NewBrokerAuth(acl)
	if err != nil {
		t.Fatal(err)
	}
	pass := map[string]string{}
	for _, u := range []string{"gw-a", "gw-b", aclAttacker, aclTarget, "operator"} {
		if pass[u], err = auth.User(u); err != nil {
			t.Fatal(err)
		}
	}
	var url string
	switch kind {
	case "mosquitto":
		url = startACLMosquitto(t, ctx, auth, dir)
	default:
		url = startBroker(t, BrokerConfig{Auth: auth}).URL()
	}
	dial := func(user, password, id string) *mqtt.Client {
		t.Helper()
		c, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{url}, ClientID: id, CleanStart: true,
			Username: user, Password: []byte(password), MinBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}

	// Anonymous clients and wrong passwords are refused.
	for _, c := range []struct{ user, password string }{{"", ""}, {aclTarget, "guess"}, {"nobody", pass["gw-a"]}} {
		cl := dial(c.user, c.password, "refused-"+c.user)
		actx, acancel := context.WithTimeout(ctx, time.Second)
		err := cl.AwaitConnection(actx)
		acancel()
		if !errors.Is(err, context.DeadlineExceeded) || cl.Connected() {
			t.Errorf("user %q password %q: connected (%v)", c.user, c.password, err)
		}
		cl.Close(context.Background())
	}

	// Every publish the ACL decides, before any subscriber exists.
	if enforced {
		for _, c := range deployACLCases {
			if !c.write || pass[c.user] == "" {
				continue
			}
			cl := dial(c.user, pass[c.user], "probe-"+c.user)
			if err := cl.AwaitConnection(ctx); err != nil {
				t.Fatal(err)
			}
			err := cl.Publish(ctx, mqtt.Message{Topic: c.topic, Payload: []byte("probe")})
			if c.want && err != nil || !c.want && !errors.Is(err, mqtt.ErrRejected) {
				t.Errorf("%s publishing to %s: %v (allowed by the ACL: %v)", c.user, c.topic, err, c.want)
			}
			cl.Close(context.Background())
		}
	}

	// The real devices and the real agent, each with its credentials.
	denied := auth.Denied()
	e := startEtcd(t, EtcdConfig{Fast: true})
	for _, d := range []string{aclAttacker, aclTarget} {
		p, err := StartProc("devsim-"+d, filepath.Join(dir, d+".log"), []string{"EDGEFENCE_MQTT_PASSWORD=" + pass[d]}, devsimBin,
			"--mqtt", url, "--devices", d, "--dir", filepath.Join(dir, d), "--log", filepath.Join(dir, d+"-verdicts.jsonl"),
			"--client-id", "devsim-"+d, "--mqtt-user", d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
		if err := p.WaitLine(ctx, "msg=ready"); err != nil {
			t.Fatal(err)
		}
	}
	ac := AgentConfig{Gateway: "gw-a", Etcd: e.Endpoint(), MQTT: url, Devices: []string{aclAttacker, aclTarget},
		Socket: filepath.Join(dir, "gw-a.sock"), StateDir: filepath.Join(dir, "gw-a-state"), MQTTUser: "gw-a",
		LeaseTTL: 2 * time.Second, LogFormat: "json"}
	cfgPath := filepath.Join(dir, "gw-a.yaml")
	if err := ac.Write(cfgPath); err != nil { // the password comes from the environment
		t.Fatal(err)
	}
	agent, err := StartProc("gw-a", filepath.Join(dir, "gw-a.log"), []string{"EDGEFENCE_MQTT_PASSWORD=" + pass["gw-a"]}, agentBin, "run", "--config", cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Stop(10 * time.Second) })
	f, send := awaitHolder(t, ctx, agentBin, agent, ac.Socket, ac.Devices)
	var seen func() map[string]bool
	if enforced {
		seen = operatorWatch(t, ctx, dial("operator", pass["operator"], "operator"))
	}
	if res := send(aclTarget, 21); res.Verdict != fence.Accepted.String() {
		t.Fatalf("round trip: %+v", res)
	}
	if enforced {
		topics := mqtt.Topics{}
		want := []string{topics.Cmd(aclTarget), topics.Ack(aclTarget), topics.State(aclTarget)}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			s := seen()
			if s[want[0]] && s[want[1]] && s[want[2]] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the operator saw %v, want %v", s, want)
			}
		}
	}
	before := ackCounts(t, ctx, f, ac.Socket)

	// The attacker: thermostat-1's credentials.
	att := dial(aclAttacker, pass[aclAttacker], "attacker")
	if err := att.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	topics := mqtt.Topics{}
	body, err := sim.SetBody{Setpoint: new(99.0)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: aclTarget, Token: 1 << 40, Seq: 1,
		ID: "forged-cmd", Kind: sim.KindSet, Body: body, Holder: "attacker"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := fence.MarshalAck(&fence.Ack{V: fence.Version, Device: aclTarget, ID: "forged-ack", Verdict: fence.Accepted, Token: 1 << 40, Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []mqtt.Message{
		{Topic: topics.Cmd(aclTarget), Payload: cmd},
		{Topic: topics.Ack(aclTarget), Payload: ack},
	} {
		err := att.Publish(ctx, m)
		if enforced && !errors.Is(err, mqtt.ErrRejected) || !enforced && err != nil {
			t.Errorf("forged publish to %s: %v", m.Topic, err)
		}
	}
	// Its own ack topic is open to it: the agent receives that one (an
	// ack for no command of its), which shows it would count the forged.
	if err := att.Publish(ctx, mqtt.Message{Topic: topics.Ack(aclAttacker), Payload: ack}); err != nil {
		t.Fatalf("publish on its own ack topic: %v", err)
	}

	// The agent's next command to the target, and what everyone saw.
	res := send(aclTarget, 23)
	wantUnmatched := before.unmatched + 1
	if !enforced {
		wantUnmatched += 2 // the forged ack, and the target's ack of the forged command
	}
	deadline := time.Now().Add(30 * time.Second)
	after := ackCounts(t, ctx, f, ac.Socket)
	for after.unmatched < wantUnmatched && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		after = ackCounts(t, ctx, f, ac.Socket)
	}
	var forged []sim.VerdictRecord
	for _, r := range readVerdicts(t, filepath.Join(dir, aclTarget+"-verdicts.jsonl")) {
		if r.ID == "forged-cmd" {
			forged = append(forged, r)
		}
	}
	t.Logf("%s: agent acks %+v -> %+v; forged command verdicts %d; next command %+v", kind, before, after, len(forged), res)
	if !enforced {
		// Without the ACL the forgery lands: the device takes the forged
		// command, its token locks the agent out, the agent gets the ack.
		if len(forged) == 0 || res.Verdict == fence.Accepted.String() || after.unmatched < wantUnmatched {
			t.Fatalf("control: the attack did not land (forged verdicts %d, next %+v, acks %+v): the test cannot see it", len(forged), res, after)
		}
		return
	}
	if len(forged) != 0 {
		t.Errorf("%s applied the forged command: %+v", aclTarget, forged)
	}
	if res.Verdict != fence.Accepted.String() {
		t.Errorf("the agent's command after the attack: %+v", res)
	}
	if after.unmatched != wantUnmatched || after.malformed != before.malformed || after.acks != before.acks+1 {
		t.Errorf("the agent received a forged ack: acks %+v, before %+v (want one more ack and one more unmatched)", after, before)
	}
	if n := auth.Denied() - denied; kind == "mochi" && n != 2 {
		t.Errorf("the broker denied %d requests, want 2 (the forged command and ack): the real flows must need no more", n)
	}
}

// operatorWatch subscribes c, the read-only operator's client, to every
// topic under the prefix (mosquitto_sub -t 'edgefence/v1/#') and returns
// the topics it has received messages on so far.
func operatorWatch(t *testing.T, ctx context.Context, c *mqtt.Client) func() map[string]bool {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]bool{}
	c.Subscribe("edgefence/v1/#", func(m mqtt.Message) {
		mu.Lock()
		seen[m.Topic] = true
		mu.Unlock()
	})
	if err := c.AwaitSubscribed(ctx); err != nil {
		t.Fatalf("the operator's subscription to edgefence/v1/#: %v", err)
	}
	return func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// startACLMosquitto runs Mosquitto with deploy/mosquitto/edgefence.conf,
// its password file made from auth's users by mosquitto_passwd -U and its
// acl_file deploy/mosquitto/edgefence.acl, and returns its URL.
func startACLMosquitto(t *testing.T, ctx context.Context, auth *BrokerAuth, dir string) string {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("..", "..", "deploy", "mosquitto", "edgefence.conf"))
	if err != nil {
		t.Fatal(err)
	}
	aclPath, err := filepath.Abs(filepath.Join("..", "..", "deploy", "mosquitto", "edgefence.acl"))
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "edgefence.passwd")
	if err := auth.WritePasswords(pw); err != nil {
		t.Fatal(err)
	}
	err = HashMosquittoPasswords(ctx, pw)
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	sec := strings.NewReplacer("/etc/mosquitto/edgefence.passwd", pw, "/etc/mosquitto/edgefence.acl", aclPath).Replace(string(conf))
	if !strings.Contains(sec, pw) || !strings.Contains(sec, aclPath) {
		t.Fatalf("deploy/mosquitto/edgefence.conf does not name /etc/mosquitto/edgefence.passwd and .acl:\n%s", conf)
	}
	m, err := StartMosquittoConfig(ctx, MosquittoConfig{Dir: t.TempDir(), Security: sec})
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m.URL()
}

// agentAcks are the agent's ack counters (edgefence status: transport).
type agentAcks struct{ acks, unmatched, malformed float64 }

func ackCounts(t *testing.T, ctx context.Context, f *figure1, sock string) agentAcks {
	t.Helper()
	st, err := f.status(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	num := func(k string) float64 {
		v, ok := st.Transport[k].(float64)
		if !ok {
			t.Fatalf("status transport %s = %v (%T)", k, st.Transport[k], st.Transport[k])
		}
		return v
	}
	return agentAcks{num("acks"), num("acks_unmatched"), num("acks_malformed")}
}

// readVerdicts reads a devsim verdict log.
func readVerdicts(t *testing.T, path string) []sim.VerdictRecord {
	t.Helper()
	fl, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	recs, err := sim.ReadVerdictLog(fl)
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", path, err))
	}
	return recs
}
