package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// The benchmarks themselves are run by hand (docs/BENCHMARKS.md); these
// tests only cover what needs no servers.

// TestMain runs the fan-out's bare paho child when the test binary is
// started as one (bareFanoutProc runs os.Executable()), as main does.
func TestMain(m *testing.M) {
	if os.Getenv(bareChildEnv) != "" {
		os.Exit(runBareChild(context.Background(), os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage"},
		{[]string{"nope"}, 2, "unknown benchmark"},
		{[]string{"roundtrip", "locks"}, 2, "more than one"},
		{[]string{"roundtrip", "--broker", "rabbit"}, 2, "--broker"},
		{[]string{"rss", "--sizes", "10,x"}, 2, "--sizes"},
		{[]string{"--fleets", "0", "roundtrip"}, 2, "--fleets"},
		{[]string{"locks", "--runs", "0"}, 2, "at least 1"},
		{[]string{"replay", "--backlog", "0"}, 2, "at least 1"},
		{[]string{"replay", "--devices", "0"}, 2, "at least 1"},
		{[]string{"replay", "--cmd-timeout", "0s"}, 2, "must be positive"},
		{[]string{"failover", "--interval", "-1ms"}, 2, "must be positive"},
		{[]string{"failover", "--ttls", "1s"}, 2, "--ttls"},
		{[]string{"failover", "--ttls", "2500ms"}, 2, "--ttls"},
		{[]string{"failover", "--ttls", "2s,x"}, 2, "--ttls"},
		{[]string{"failover", "--faults", "kill,pause"}, 2, "--faults"},
		{[]string{"replay", "failover"}, 2, "more than one"},
		{[]string{"twins", "roundtrip"}, 2, "more than one"},
		{[]string{"etcdcost", "--etcd", "zookeeper"}, 2, "--etcd"},
		{[]string{"twins", "--changes", "0"}, 2, "at least 1"},
		{[]string{"twins", "--twin-fleets", "0"}, 2, "at least 1"},
		{[]string{"twins", "--twin-runs", "-1"}, 2, "--twin-runs"},
		{[]string{"twins", "--twin-sizes", "1,x"}, 2, "--twin-sizes"},
		{[]string{"twins", "--twin-sizes", "0"}, 2, "--twin-sizes"},
		{[]string{"twins", "--devices", "10", "--twin-sizes", "1,100"}, 2, "--twin-sizes"},
		{[]string{"modbus-rtu", "--bauds", "9600,x"}, 2, "--bauds"},
		{[]string{"modbus-rtu", "--rtu-n", "0"}, 2, "--rtu-n"},
		{[]string{"fwrollout", "--image-size", "64KB"}, 2, "--image-size"},
		{[]string{"fwrollout", "--chunk", "0"}, 2, "--chunk"},
		{[]string{"fwrollout", "--chunk", "64KiB"}, 2, "more than a fw.chunk carries"},
		{[]string{"fwrollout", "--concurrent", "0"}, 2, "--concurrent"},
		{[]string{"fwrollout", "--fw-timeout", "0s"}, 2, "--fw-timeout"},
		{[]string{"fwrollout", "rss"}, 2, "more than one"},
		{[]string{"cluster", "--agents", "1"}, 2, "--agents"},
		{[]string{"cluster", "--spare-agents", "2", "--agents", "2"}, 2, "--spare-agents"},
		{[]string{"cluster", "--etcd-nodes", "0"}, 2, "--etcd-nodes"},
		{[]string{"cluster", "--ttl", "1500ms"}, 2, "--ttl"},
		{[]string{"cluster", "--leader-kill", "-1s"}, 2, "--leader-kill"},
		{[]string{"-h"}, 0, "usage"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errb.String())
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: stderr %q does not mention %q", tc.args, errb.String(), tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	s := summarize(lat)
	if s.N != 100 || s.P50 != 50*time.Microsecond || s.P99 != 99*time.Microsecond || s.Max != 100*time.Microsecond {
		t.Fatalf("%+v", s)
	}
	if s.Mean != 50500*time.Nanosecond {
		t.Fatalf("mean %v", s.Mean)
	}
	if (summarize(nil) != summary{}) {
		t.Fatal("empty sample")
	}
}

func TestDeviceIDs(t *testing.T) {
	if got := deviceIDs("d-", 3); strings.Join(got, ",") != "d-000,d-001,d-002" {
		t.Fatal(got)
	}
	if got := deviceIDs("d-", 1001); got[1000] != "d-1000" || got[0] != "d-0000" {
		t.Fatal(got[0], got[1000])
	}
}

func TestTTLAndFaultLists(t *testing.T) {
	ttls, err := ttlList("2s, 5s,10s")
	if err != nil || len(ttls) != 3 || ttls[0] != 2*time.Second || ttls[2] != 10*time.Second {
		t.Fatal(ttls, err)
	}
	faults, err := faultList("stop,kill")
	if err != nil || strings.Join(faults, ",") != "stop,kill" {
		t.Fatal(faults, err)
	}
}

func TestReqCounter(t *testing.T) {
	var r reqCounter
	for _, m := range []string{"/etcdserverpb.KV/Range", "/etcdserverpb.KV/Range", "/etcdserverpb.KV/Txn", "/etcdserverpb.KV/Put",
		"/etcdserverpb.Lease/LeaseGrant"} {
		r.count(m, false)
	}
	r.count("/etcdserverpb.Watch/Watch", true)
	r.count("/etcdserverpb.Lease/LeaseKeepAlive", true)
	c := r.snapshot()
	if c.Range != 2 || c.Txn != 1 || c.Put != 1 || c.Other != 1 || c.WatchMsgs != 1 || c.KeepAlives != 1 {
		t.Fatalf("%+v", c)
	}
	if c.kv() != 6 {
		t.Fatalf("kv %d, want 6 (keepalives apart)", c.kv())
	}
	if d := c.sub(reqCounts{Range: 1}); d.Range != 1 || d.Txn != 1 {
		t.Fatalf("%+v", d)
	}
}

func TestSetpointIs(t *testing.T) {
	if !setpointIs([]byte(`{"state":{"setpoint":21.5,"mode":"heat"}}`), 21.5) {
		t.Fatal("21.5 not found")
	}
	for _, v := range []string{`{"state":{"setpoint":21}}`, `{"state":{}}`, `nope`} {
		if setpointIs([]byte(v), 21.5) {
			t.Fatalf("%s matched 21.5", v)
		}
	}
}

func TestSlogLine(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	log.Info("released locks", "keys", 3)
	log.Info("ready")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, want := range []string{"released locks", "ready"} {
		at, msg, ok := slogLine(lines[i])
		if !ok || msg != want || time.Since(at) > time.Minute {
			t.Fatalf("%q: %v %q %v", lines[i], at, msg, ok)
		}
	}
	if _, _, ok := slogLine("gc 1 @0.01s"); ok {
		t.Fatal("a gctrace line parsed")
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int{"100": 100, "64KiB": 64 << 10, " 2 MiB": 2 << 20, "1KiB": 1024} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1KiB", "1GiB", "KiB", "1.5MiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}

func TestFWRolloutDefaults(t *testing.T) {
	fs, f := newFlagSet(&bytes.Buffer{})
	what, _, ok := parseArgs(fs, []string{"fwrollout"}, &bytes.Buffer{})
	if !ok {
		t.Fatal("fwrollout did not parse")
	}
	b, err := f.benches(what, map[string]bool{})
	if err != nil {
		t.Fatal(err)
	}
	if c := b.fw; c.Devices != 1000 || c.Concurrent != 50 || c.ImageSize != 64<<10 || c.Chunk != 16<<10 || c.Runs != 3 {
		t.Fatalf("%+v", c)
	}
}

// TestFWRolloutTiny runs the fwrollout benchmark end to end on 3 devices,
// 2 at a time, a 4 KiB image in 1 KiB chunks: both binaries built, etcd,
// mochi, the devsim and the agent for real; the rollout must complete
// with every execution succeeded and the table printed.
func TestFWRolloutTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs edgefence and edgefence-devsim")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"fwrollout", "--devices", "3", "--concurrent", "2", "--runs", "1", "--image-size", "4KiB", "--chunk", "1KiB", "--fw-timeout", "5m"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"### Firmware rollout: 3 devices", "max_concurrent 2", "| 1 | ", "median time to done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	t.Log(out.String())
}

// TestClusterTiny runs the cluster benchmark end to end, small: 40
// devices on 3 agents (one a spare) over a 3-node etcd of Debian's
// binary, every part a separate process. It must end with exit 0: both
// takeovers — the agent holding the most devices killed (SIGKILL), then
// again with the etcd leader killed a second later — end with every one
// of the victim's devices held by its backup and every one having
// accepted a command from it. Times are printed, never judged here.
func TestClusterTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs edgefence, edgefence-devsim and three etcd members")
	}
	sandbox.NeedEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"cluster", "--agents", "3", "--spare-agents", "1", "--devices", "40", "--devsims", "1", "--devsim-lanes", "2",
		"--etcd-nodes", "3", "--ttl", "3s", "--leader-kill", "1s", "--steady", "1s", "--runs", "1"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"### Cluster: 40 devices over 3 agents on a 3-node etcd", "| 1 | gw-", "| 2 | gw-", "member ", "cluster: takeover 2: 20 devices:"} {
		if !strings.Contains(out.String()+errb.String(), want) {
			t.Errorf("output lacks %q:\n%s\n%s", want, out.String(), errb.String())
		}
	}
	t.Log(out.String())
}

// TestSignedTiny runs the fan-out and the cluster benchmarks signed (--sign)
// end to end, small, on the real binaries (built once). The fan-out: 20
// devices `auth: required`, the agent sends no plain envelope, and the
// bare paho client signs every envelope and verifies every ack (20 of 20
// accepted, none refused). The cluster: 8 devices over 2 agents on
// Debian's etcd, the devsims provisioned with the root and device keys
// only, so the taker's certificate reaches them as its trust update; the
// takeover must end with all 8 accepted (exit 0) and no plain envelope.
func TestSignedTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs edgefence and edgefence-devsim")
	}
	sandbox.NeedEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var bins []string
	for _, name := range []string{"edgefence", "edgefence-devsim"} {
		bin, err := buildBinary(ctx, dir, name, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		bins = append(bins, bin)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"fanout", []string{"fanout", "--sign", "--fanout-sizes", "20", "--runs", "2", "--fanout-fleets", "1", "--fanout-lanes", "4", "--agent-bin", bins[0]},
			[]string{"### Fan-out: one POST /v1/fanout to every device, signed (auth: required)", "| 20 | 2 | ",
				"- 20 devices: agent, 0 unsigned sends over 2 fan-outs; bare client, signed true, 20 of 20 acks verified accepted, 0 refused"}},
		{"cluster", []string{"cluster", "--sign", "--agents", "2", "--spare-agents", "1", "--devices", "8", "--devsims", "1", "--devsim-lanes", "2",
			"--etcd-nodes", "1", "--ttl", "2s", "--leader-kill", "0s", "--steady", "1s", "--runs", "1", "--agent-bin", bins[0], "--devsim-bin", bins[1]},
			[]string{"lease_ttl 2s, signed", "| 1 | gw-0 | 8 | no |", "- takeover 1, signed: the takers sent 0 plain envelopes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(ctx, tc.args, &out, &errb); code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, out.String(), errb.String())
				}
			}
		})
	}
}

// The cluster benchmark's placement: every device has one home and one
// backup, never the same agent; a killed home's devices are spread over
// the other agents (no spares) or go to the spares.
func TestClusterPlan(t *testing.T) {
	for _, tc := range []struct{ agents, spare, devices, devsims int }{{10, 0, 1000, 2}, {2, 1, 100, 4}, {2, 0, 100, 1}, {4, 2, 60, 3}} {
		cfg := clusterConfig{Agents: tc.agents, Spare: tc.spare, Devices: tc.devices, Devsims: tc.devsims}
		p, err := newClusterPlan(cfg)
		if err != nil {
			t.Fatal(err)
		}
		home, backup := map[string]int{}, map[string]int{}
		for i := range tc.agents {
			for _, d := range p.home[i] {
				home[d] = i
			}
			for _, d := range p.backup[i] {
				if _, dup := backup[d]; dup {
					t.Fatalf("%+v: %s backed up twice", tc, d)
				}
				backup[d] = i
			}
		}
		if len(home) != tc.devices || len(backup) != tc.devices {
			t.Fatalf("%+v: %d homes, %d backups", tc, len(home), len(backup))
		}
		takers := map[int]int{}
		for d, h := range home {
			if backup[d] == h {
				t.Fatalf("%+v: %s backed up by its home", tc, d)
			}
			if h == 0 {
				takers[backup[d]]++
			}
		}
		want := tc.agents - 1
		if tc.spare > 0 {
			want = tc.spare
		}
		if len(takers) != want {
			t.Fatalf("%+v: agent 0's devices go to %v (want %d takers)", tc, takers, want)
		}
	}
	if _, err := newClusterPlan(clusterConfig{Agents: 3, Devices: 100, Devsims: 3}); err == nil {
		t.Fatal("100 devices over 9 devsims: no error")
	}
}

func TestEtcdCostPhaseFromMetrics(t *testing.T) {
	text := `# HELP grpc_server_handled_total x
grpc_server_handled_total{grpc_code="OK",grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 10
grpc_server_handled_total{grpc_code="Unavailable",grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 2
grpc_server_handled_total{grpc_code="OK",grpc_method="Status",grpc_service="etcdserverpb.Maintenance",grpc_type="unary"} 7
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 3
etcd_debugging_mvcc_watcher_total 4
garbage
`
	a, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseMetrics(strings.NewReader(strings.NewReplacer(" 10\n", " 30\n", " 3\n", " 9\n", "total 4", "total 8", " 7\n", " 99\n").Replace(text)))
	if err != nil {
		t.Fatal(err)
	}
	p := diffSnap("x", 2, etcdSnap{Rev: 5, M: a}, etcdSnap{Rev: 9, M: b})
	if p.Revs != 4 || p.Requests["Txn"] != 20 || p.Requests["LeaseKeepAlive"] != 6 || p.Watchers != 4 {
		t.Errorf("phase %+v", p)
	}
	if _, ok := p.Requests["Status"]; ok {
		t.Errorf("the measuring client's Status counted: %+v", p.Requests)
	}
}

// TestShipTagsAsMakefile: the bench builds the agent with the tags the
// Makefile ships it with (SHIPTAGS, its $(GOTAGS) expanded).
func TestShipTagsAsMakefile(t *testing.T) {
	want, err := sandbox.ShipTags("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if tagsWith() != want {
		t.Errorf("the bench builds with -tags %s, the Makefile ships -tags %s", tagsWith(), want)
	}
}
