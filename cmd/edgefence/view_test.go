package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// appendConfig appends YAML to the agent config at path.
func appendConfig(t *testing.T, path, yaml string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(yaml); err != nil {
		t.Fatal(err)
	}
}

// logLines returns the JSON log lines of an agent started by startAgent
// whose message is msg.
func (e *env) logLines(name, msg string) []map[string]any {
	e.t.Helper()
	f, err := os.Open(filepath.Join(e.dir, name+".log"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// pollStatus polls `status --json` until cond holds, and returns it.
func pollStatus(t *testing.T, sock, what string, cond func(*agent.Status) bool) *agent.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, r := status(t, sock)
		if st != nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last status:\n%s", what, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRunOperatorView runs the real binary
// with twins and metrics on:
//
//   - malformed device state reports on the MQTT state topic are counted
//     (status, /metrics) and logged at WARN once per device per 10 s, not
//     at DEBUG;
//   - a real SIGSTOP of the agent shows up in its hiccup meter, the
//     observed tail above lease_ttl/3 raises the warning in status, the
//     log and /metrics, and the human status reads as text (MQTT line,
//     token_regressions, the tail).
func TestRunOperatorView(t *testing.T) {
	e := newEnv(t, "dev-1")
	const ttl = 6 * time.Second // warning above 2 s of tail
	cfg, sock := e.config("gw-1", ttl)
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	appendConfig(t, cfg, fmt.Sprintf("twins:\n  enabled: true\nmetrics:\n  listen: %q\n", addr))
	p := e.startAgent("gw-1", cfg)
	e.waitHolding(p, sock)
	scrape := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// Malformed state reports: three from dev-1, two from devices the
	// agent does not know.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{e.world.Broker.URL()}, ClientID: "garbage-" + t.Name(), CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pub.Close(cctx)
	}()
	if err := pub.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	topics := mqtt.Topics{Prefix: agent.DefaultMQTTPrefix}
	for _, dev := range []string{"dev-1", "dev-1", "dev-1", "ghost-1", "ghost-2"} {
		if err := pub.Publish(ctx, mqtt.Message{Topic: topics.State(dev), Payload: []byte{0xff, 0x00, 0x13}}); err != nil {
			t.Fatal(err)
		}
	}
	pollStatus(t, sock, "five malformed state reports counted", func(st *agent.Status) bool { return st.Counters.StateMalformed == 5 })
	if m := scrape(); !strings.Contains(m, "edgefence_state_reports_malformed_total 5") {
		t.Errorf("/metrics lacks edgefence_state_reports_malformed_total 5")
	}
	warns := e.logLines("gw-1", "device state report malformed; dropped")
	if len(warns) != 2 { // one for dev-1, one for the unknown devices together
		t.Errorf("malformed reports logged %d times, want 2 (one per device per 10 s, unknown devices together): %v", len(warns), warns)
	}
	for _, l := range warns {
		if l["level"] != "WARN" || l["err"] == "" {
			t.Errorf("malformed report line: %v", l)
		}
	}

	// A real stall: the whole agent frozen with SIGSTOP for longer than
	// lease_ttl/3.
	const freeze = 2500 * time.Millisecond
	if err := p.Freeze(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(freeze)
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	st := pollStatus(t, sock, "the stall in the hiccup meter and a keep-alive probe", func(st *agent.Status) bool {
		return st.LeaseTail.Stall.Max >= 2.0 && st.LeaseTail.KeepAlive.Samples > 0
	})
	lt := st.LeaseTail
	if lt.Warning == "" || lt.TTL != ttl.Seconds() || lt.Tail < lt.Stall.Max || lt.Margin != lt.TTL-lt.Tail || lt.Fsync == nil || lt.Fsync.Samples == 0 {
		t.Errorf("lease tail %+v: want the warning, tail ≥ stall, margin = ttl − tail, outbox commits measured", lt)
	}
	pollStatus(t, sock, "the warning logged", func(*agent.Status) bool {
		return len(e.logLines("gw-1", "lease tail above lease_ttl/3: raise etcd.lease_ttl or find the stall (README, choosing lease_ttl)")) == 1
	})
	m := scrape()
	for _, want := range []string{"edgefence_lease_tail_warning 1", `edgefence_scheduling_stall_seconds_bucket{le="+Inf"}`,
		`edgefence_etcd_keepalive_rtt_seconds_bucket{le="+Inf"}`, `edgefence_state_fsync_seconds_bucket{le="+Inf"}`, "edgefence_lease_tail_seconds "} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Stall buckets: the frozen wake is above 1 s (le="1" < count).
	r := edgefence(t, "status", "--socket", sock)
	for _, want := range []string{"mqtt     connected to mqtt://", " reconnects; published ", "token_regressions 0",
		"tail     last 5m: max stall ", "lease_ttl 6.0 s: margin ", "WARNING  observed tail ", "(5 malformed)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status text lacks %q\n%s", want, r)
		}
	}
	if strings.Contains(r.stdout, `{"`) {
		t.Errorf("status text has raw JSON\n%s", r)
	}
}
