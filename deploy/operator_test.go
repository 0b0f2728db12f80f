package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// TestInstallAndOperate operates an installed agent end to end, with what
// the package installs: the amd64 .deb unpacked into a scratch root, the
// installed /etc/edgefence/config.yaml edited (gateway id, etcd, broker,
// devices, metrics), `config check` refusing it for want of a key and
// naming the command that fixes it, `keys init` (the keys in
// /etc/edgefence/keys, the auth: block in the config) and `keys enrol` for
// the devices, the agent started the way the installed unit's ExecStart
// says, with the keys only as the credentials its LoadCredential= lines
// give (the keys directory moved away) and a NOTIFY_SOCKET standing in for
// systemd: READY=1; then leases, tokens, signed commands and a refusal
// seen in `edgefence status`, `edgefence devices` and on /metrics, and
// SIGTERM → STOPPING=1, exit 0. Real etcd, a real MQTT broker and
// simulated devices that take only signed commands (sandbox); only
// systemd itself is not real (TestUnitVerify, TestSystemdNotify).
func TestInstallAndOperate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the package and runs the installed agent")
	}
	if runtime.GOOS+"/"+runtime.GOARCH != "linux/amd64" {
		skipUnlessCI(t, "runs the amd64 package's binary on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	mk := tool(t, "make", "apt-get install make")
	dpkgDeb := tool(t, "dpkg-deb", "apt-get install dpkg")
	root := t.TempDir()
	run(t, time.Minute, ".", nil, dpkgDeb, "-x", filepath.Join(amd64Packages(t, mk), "edgefence_"+version+"_amd64.deb"), root)
	bin := filepath.Join(root, "usr/bin/edgefence")
	cfgPath := filepath.Join(root, "etc/edgefence/config.yaml")

	// The gateway's world: etcd and a broker.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{Dir: filepath.Join(dir, "world"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	devices := []string{"thermostat-1", "thermostat-2"}

	// 1. Edit the one config file, as an operator would: keys changed in
	// place, everything else as shipped.
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	socket := filepath.Join(dir, "edgefence.sock")
	editConfig(t, cfgPath, map[string]any{
		"gateway":            "gw-pi-07",
		"state_dir":          filepath.Join(dir, "state"), // the unit's StateDirectory
		"etcd.endpoints":     []string{w.Etcd.Endpoint()},
		"mqtt.brokers":       []string{w.Broker.URL()},
		"api.socket":         socket, // the unit's RuntimeDirectory
		"metrics.listen":     metricsAddr,
		"metrics.per_device": true, // the device series below
		"devices":            []map[string]string{{"id": devices[0]}, {"id": devices[1], "policy": "autonomous"}},
	})
	// Secure by default: signed devices and no key yet, refused, the fix
	// named; `keys init` is the fix.
	out, err := runErr(t, time.Minute, ".", nil, bin, "config", "check", cfgPath)
	if err == nil || !strings.Contains(string(out), "auth.key_file: not set") || !strings.Contains(string(out), "run `edgefence keys init --config "+cfgPath+"`") {
		t.Fatalf("config check without a key: %v, want a refusal naming keys init\n%s", err, out)
	}
	keys := filepath.Join(root, "etc/edgefence/keys")
	run(t, time.Minute, ".", nil, bin, "keys", "init", "--config", cfgPath, "--dir", keys)
	if out, err := runErr(t, time.Minute, ".", nil, bin, "config", "check", cfgPath); err != nil {
		t.Fatalf("config check after keys init: %v\n%s", err, out)
	}
	otherCert, otherKey := otherGateway(t, bin, keys, dir)
	fleet := signedFleet(t, ctx, bin, cfgPath, keys, w, devices, dir, otherCert)
	other := otherCommander(t, ctx, w, fleet, devices[0], otherKey)

	// 2. `systemctl enable --now edgefence`: the unit's ExecStart, with the
	// scratch root's paths, its credentials, and systemd's notify socket.
	args := unitExecStart(t, root)
	creds := unitCredentials(t, root, filepath.Join(dir, "credentials"))
	if err := os.Rename(keys, keys+".away"); err != nil { // the agent may read them only as credentials
		t.Fatal(err)
	}
	notify := listenNotify(t, dir)
	p, err := sandbox.StartProc("edgefence", filepath.Join(dir, "edgefence.log"), []string{"NOTIFY_SOCKET=" + notify.addr, "CREDENTIALS_DIRECTORY=" + creds}, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-p.Done():
		default:
			p.Stop(10 * time.Second)
		}
	})
	if msg := notify.wait(t, p, "READY=1"); !strings.Contains(msg, "STATUS=") {
		t.Errorf("READY without a STATUS line: %q", msg)
	}

	// 3. Leases and tokens in `edgefence status`.
	var st agent.Status
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := runErr(t, time.Minute, ".", nil, bin, "status", "--json", "--config", cfgPath)
		if err == nil && json.Unmarshal(out, &st) == nil && held(&st) == len(devices) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the installed agent does not hold its devices: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	text := string(run(t, time.Minute, ".", nil, bin, "status", "--config", cfgPath))
	for _, d := range st.Devices {
		if d.Token == 0 || !strings.Contains(text, d.ID) || !strings.Contains(text, fmt.Sprint(d.Token)) {
			t.Errorf("status text does not show %s with token %d:\n%s", d.ID, d.Token, text)
		}
	}

	// 4. A signed command accepted, then a refusal: another holder with a
	// newer token reaches thermostat-1 first (its commander, signing with a
	// key the same root certified, stands in for a gateway that took the
	// device over), and our next command is stale.
	sendJSON := func(device, body string) (agent.SendResult, error) {
		out, err := runErr(t, time.Minute, ".", nil, bin, "send", "--json", "--config", cfgPath, device, "set", body)
		var res agent.SendResult
		if jerr := json.Unmarshal(out, &res); jerr != nil {
			t.Fatalf("send output does not parse: %v\n%s", jerr, out)
		}
		return res, err
	}
	if res, err := sendJSON(devices[0], `{"setpoint":21}`); err != nil || res.Verdict != "accepted" {
		t.Fatalf("first command: %+v, %v", res, err)
	}
	body, err := fence.EncodeBody(map[string]any{"setpoint": 30})
	if err != nil {
		t.Fatal(err)
	}
	newer := st.Devices[0].Token + 1000
	if ack, err := other.Send(ctx, &fence.Envelope{V: fence.Version, Device: devices[0], Token: newer, Seq: 1, ID: "other-1",
		Kind: "set", Body: body, Holder: "gw-other"}); err != nil || ack.Verdict != fence.Accepted {
		t.Fatalf("the newer holder's command: %+v, %v", ack, err)
	}
	res, err := sendJSON(devices[0], `{"setpoint":22}`)
	if res.Verdict != "stale" || exitCode(err) != 3 {
		t.Fatalf("our command after the newer holder: %+v, %v; want stale, exit 3", res, err)
	}
	if s, err := fleet.State(devices[0]); err != nil || s.Setpoint != 30 {
		t.Fatalf("thermostat-1: %+v, %v; want the newer holder's setpoint 30, ours refused", s, err)
	}

	// 5. The refusal in `edgefence status`, `edgefence devices` and /metrics,
	// and the lease change it caused. The newer token came from no lock of
	// this etcd while the agent's key still held the lock: the agent takes
	// it for a token regression (as after a wiped etcd), refuses the device
	// and lets its lock go.
	for deadline := time.Now().Add(30 * time.Second); ; {
		text = string(run(t, time.Minute, ".", nil, bin, "status", "--config", cfgPath))
		if strings.Contains(line(text, devices[0]), "refused") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(text, "stale 1") || !strings.Contains(line(text, devices[0]), "refused") {
		t.Errorf("status text does not count the stale refusal or show %s refused:\n%s", devices[0], text)
	}
	devs := string(run(t, time.Minute, ".", nil, bin, "devices", "--config", cfgPath))
	if row := line(devs, devices[0]); !strings.Contains(row, "1/1") || !strings.Contains(row, "stale") {
		t.Errorf("devices row of %s does not show 1 accepted / 1 stale and the stale verdict: %q\n%s", devices[0], row, devs)
	}
	metrics := scrapeText(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		// The stale verdict told the agent it may not command
		// thermostat-1: refused (no token), a token regression counted;
		// thermostat-2 still held under its token.
		"edgefence_leases_held 1",
		`edgefence_devices{state="refused"} 1`,
		fmt.Sprintf(`edgefence_device_state{device=%q,state="refused"} 1`, devices[0]),
		"edgefence_token_regressions_total 1",
		fmt.Sprintf(`edgefence_device_token{device=%q} %d`, devices[1], st.Devices[1].Token),
		"edgefence_lease_acquisitions_total 2",
		"edgefence_lease_losses_total 1",
		fmt.Sprintf(`edgefence_device_commands_total{device=%q,verdict="stale"} 1`, devices[0]),
		fmt.Sprintf(`edgefence_device_commands_total{device=%q,verdict="accepted"} 1`, devices[0]),
		`edgefence_commands_total{verdict="stale"} 1`,
		"edgefence_etcd_session_up 1",
		"edgefence_devices_auth_off 0", // signed, every one
		"edgefence_mqtt_connected 1",
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(metrics, "edgefence_leases|edgefence_device_token|edgefence_device_state"))
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := httpCode(t, "http://"+metricsAddr+path); code != http.StatusOK {
			t.Errorf("%s: %d", path, code)
		}
	}

	// 6. `systemctl stop edgefence`: SIGTERM, STOPPING=1, exit 0.
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(30 * time.Second) }()
	notify.wait(t, p, "STOPPING=1")
	if err := <-stopped; err != nil {
		t.Fatalf("the installed agent after SIGTERM: %v; want exit 0", err)
	}
}

// editConfig sets dotted top-level.child keys in a YAML config file and
// writes it back (comments of the edited file are not kept).
func editConfig(t *testing.T, path string, set map[string]any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		top, child, nested := strings.Cut(k, ".")
		if !nested {
			m[top] = v
			continue
		}
		sub, _ := m[top].(map[string]any)
		if sub == nil {
			sub = map[string]any{}
			m[top] = sub
		}
		sub[child] = v
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// unitExecStart returns the arguments of the installed unit's ExecStart,
// with its config path moved into the scratch root.
func unitExecStart(t *testing.T, root string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, unitPath))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ExecStart="); ok {
			fields := strings.Fields(v)
			if len(fields) < 2 || fields[0] != "/usr/bin/edgefence" {
				t.Fatalf("ExecStart=%s: want /usr/bin/edgefence ...", v)
			}
			args := fields[1:]
			for i, a := range args {
				if strings.HasPrefix(a, "/etc/") {
					args[i] = filepath.Join(root, a)
				}
			}
			return args
		}
	}
	t.Fatal("the installed unit has no ExecStart")
	return nil
}

// notifySocket is systemd's end of NOTIFY_SOCKET.
type notifySocket struct {
	addr string
	msgs chan string
}

func listenNotify(t *testing.T, dir string) *notifySocket {
	t.Helper()
	addr := filepath.Join(dir, "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{addr: addr, msgs: make(chan string, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			select {
			case s.msgs <- string(buf[:n]):
			default:
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return s
}

// wait returns the first message containing want, failing if the process
// exits first or none comes within a minute.
func (s *notifySocket) wait(t *testing.T, p *sandbox.Proc, want string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case m := <-s.msgs:
			if strings.Contains(m, want) {
				return m
			}
		case <-p.Done():
			t.Fatalf("edgefence exited before %s", want)
		case <-timeout:
			t.Fatalf("no %s from edgefence within a minute", want)
		}
	}
}

func held(st *agent.Status) int {
	n := 0
	for _, d := range st.Devices {
		if d.State == agent.StateHolding && d.Token != 0 {
			n++
		}
	}
	return n
}

func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// line returns the first line of text that starts with prefix.
func line(text, prefix string) string {
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func httpCode(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func grepLines(text, alts string) string {
	var b strings.Builder
	for l := range strings.Lines(text) {
		for _, a := range strings.Split(alts, "|") {
			if strings.HasPrefix(l, a) {
				b.WriteString(l)
				break
			}
		}
	}
	return b.String()
}
