package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
)

// twinPrefix is the etcd prefix of the twin tests' config.
const twinPrefix = "/twintest"

// twinEnv is a real etcd and an agent config naming dev-1 and dev-2 on it.
type twinEnv struct {
	t        *testing.T
	endpoint string
	config   string
	etcd     *clientv3.Client
}

func newTwinEnv(t *testing.T) *twinEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	e, err := sandbox.StartEtcd(ctx, sandbox.EtcdConfig{Dir: filepath.Join(dir, "etcd"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	cfg := strings.Replace(goodConfig, "http://127.0.0.1:2379", e.Endpoint(), 1)
	cfg = strings.Replace(cfg, "etcd:\n", "etcd:\n  prefix: "+twinPrefix+"\n", 1)
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return &twinEnv{t: t, endpoint: e.Endpoint(), config: path, etcd: cli}
}

// getJSON runs twin get --json with the given source flags.
func (e *twinEnv) getJSON(dev string, src ...string) *shadow.Document {
	e.t.Helper()
	r := edgefence(e.t, append([]string{"twin", "get", "--json", dev}, src...)...)
	if r.code != 0 {
		e.t.Fatal(r)
	}
	var doc shadow.Document
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		e.t.Fatalf("%v\n%s", err, r)
	}
	return &doc
}

// snapshot returns etcd's revision and everything under the prefix.
func (e *twinEnv) snapshot() string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	r, err := e.etcd.Get(ctx, twinPrefix+"/", clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "revision %d\n", r.Header.Revision)
	for _, kv := range r.Kvs {
		fmt.Fprintf(&b, "%s@%d %s\n", kv.Key, kv.ModRevision, kv.Value)
	}
	return b.String()
}

// report writes dev's reported state as a lease holder would: under a
// lock key of the device, with its CreateRevision as the token.
func (e *twinEnv) report(dev, patch string) (token int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	st := shadow.NewStore(e.etcd, shadow.StoreConfig{Prefix: twinPrefix, Writer: "gw-test"})
	lockKey := st.LockPrefix(dev) + "/test"
	r, err := e.etcd.Put(ctx, lockKey, "", clientv3.WithPrevKV())
	if err != nil {
		e.t.Fatal(err)
	}
	token = r.Header.Revision
	if r.PrevKv != nil {
		token = r.PrevKv.CreateRevision
	}
	p, err := shadow.DecodeJSON([]byte(patch), shadow.Limits{})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := st.UpdateReported(ctx, dev, p, lockKey, token); err != nil {
		e.t.Fatal(err)
	}
	return token
}

func TestTwinGetSet(t *testing.T) {
	e := newTwinEnv(t)
	cfg := []string{"--config", e.config}

	// An empty twin.
	r := edgefence(t, "twin", "get", "dev-1", "--config", e.config)
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "desired: not written (version 0)") ||
		!strings.Contains(r.stdout, "reported: not written (version 0)") || !strings.Contains(r.stdout, "delta: none") {
		t.Fatal(r)
	}
	if doc := e.getJSON("dev-1", cfg...); doc.Version != 0 || doc.Desired.Version != 0 || len(doc.Desired.Fields) != 0 ||
		len(doc.Delta) != 0 || doc.Device != "dev-1" {
		t.Fatalf("%+v", doc)
	}

	// Set, then get.
	r = edgefence(t, "twin", "set", "--config", e.config, "--writer", "alice", "dev-1",
		`{"setpoint": 22.5, "cfg": {"fan": "auto", "modes": [1, 2]}}`)
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "dev-1: desired now at version ") {
		t.Fatal(r)
	}
	doc := e.getJSON("dev-1", cfg...)
	v1 := doc.Desired.Version
	if v1 == 0 || doc.Desired.Fields["setpoint"] != 22.5 || doc.Desired.Meta["/cfg/fan"].By != "alice" ||
		doc.Desired.Meta["/cfg/fan"].At.IsZero() || !shadow.Equal(doc.Delta, doc.Desired.Fields) || doc.Version != v1 {
		t.Fatalf("%+v", doc)
	}
	if !strings.Contains(r.stdout, fmt.Sprintf("version %d\n", v1)) {
		t.Errorf("set printed another version than get reads (%d):\n%s", v1, r.stdout)
	}

	// Merge semantics with a version check: null deletes, nested objects
	// merge, arrays replace; the default writer is cli:<user>@<host>.
	r = edgefence(t, "twin", "set", "dev-1", `{"cfg": {"fan": null, "modes": [3]}, "mode": "eco"}`,
		"--if-version", fmt.Sprint(v1), "--config", e.config, "--json")
	var st shadow.State
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 {
		t.Fatalf("%v\n%s", err, r)
	}
	want := map[string]any{"setpoint": 22.5, "mode": "eco", "cfg": map[string]any{"modes": []any{3.0}}}
	if !shadow.Equal(st.Fields, want) || st.Version <= v1 || !strings.HasPrefix(st.Meta["/mode"].By, "cli:") ||
		!strings.Contains(st.Meta["/mode"].By, "@") || st.Meta["/setpoint"].By != "alice" {
		t.Fatalf("%+v", st)
	}
	if _, ok := st.Meta["/cfg/fan"]; ok {
		t.Errorf("metadata of a deleted field kept: %+v", st.Meta)
	}

	// The device reports: get shows both sides, the token and the delta.
	token := e.report("dev-1", `{"setpoint": 22.5, "mode": "off", "temp": 19.5}`)
	r = edgefence(t, "twin", "get", "dev-1", "--config", e.config)
	for _, s := range []string{
		fmt.Sprintf("desired: version %d (twin set --if-version %d)", st.Version, st.Version),
		"/cfg/modes  [3]", `/mode       "eco"`, "alice",
		"reported: version ", "TOKEN", fmt.Sprintf("gw-test  %d", token), "/temp",
		"delta (desired fields the device has not reported yet):\n  /cfg/modes  [3]\n  /mode       \"eco\"\n",
	} {
		if r.code != 0 || !strings.Contains(r.stdout, s) {
			t.Errorf("want %q in\n%s", s, r)
		}
	}
	if strings.Contains(r.stdout[strings.Index(r.stdout, "delta"):], "/setpoint") {
		t.Errorf("converged field in the delta:\n%s", r.stdout)
	}

	// --etcd and --prefix without a config: the same twin, and any valid id.
	byURL := []string{"--etcd", e.endpoint, "--prefix", twinPrefix}
	if d := e.getJSON("dev-1", byURL...); d.Desired.Version != st.Version || d.Reported.Fields["temp"] != 19.5 ||
		d.Reported.Meta["/temp"].Token != token || d.Version < st.Version {
		t.Errorf("%+v", d)
	}
	if r := edgefence(t, append([]string{"twin", "set", "other-7", `{"a": 1}`}, byURL...)...); r.code != 0 {
		t.Error(r)
	}
	if d := e.getJSON("other-7", byURL...); d.Desired.Fields["a"] != 1.0 {
		t.Errorf("%+v", d)
	}

	// The patch from stdin.
	cmd := exec.Command(os.Args[0], "twin", "set", "--config", e.config, "dev-2", "-")
	cmd.Env = append(os.Environ(), subprocEnv()...)
	cmd.Stdin = strings.NewReader(`{"from": "stdin"}`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if d := e.getJSON("dev-2", cfg...); d.Desired.Fields["from"] != "stdin" {
		t.Errorf("%+v", d)
	}
}

func TestTwinSetConflict(t *testing.T) {
	e := newTwinEnv(t)
	set := func(args ...string) result {
		return edgefence(t, append([]string{"twin", "set", "--config", e.config}, args...)...)
	}
	if r := set("dev-1", `{"n": 1}`); r.code != 0 {
		t.Fatal(r)
	}
	read := e.getJSON("dev-1", "--config", e.config).Desired.Version
	if r := set("dev-1", `{"n": 2}`); r.code != 0 { // another writer
		t.Fatal(r)
	}
	cur := e.getJSON("dev-1", "--config", e.config).Desired.Version
	before := e.snapshot()

	// The stale version: exit 5, the current version said, nothing written.
	r := set("--if-version", fmt.Sprint(read), "dev-1", `{"n": 3}`)
	if r.code != exitConflict || r.stdout != "" ||
		!strings.Contains(r.stderr, fmt.Sprintf("desired is at version %d, not %d", cur, read)) ||
		!strings.Contains(r.stderr, "edgefence twin get dev-1") {
		t.Fatal(r)
	}
	r = set("--if-version", fmt.Sprint(read), "--json", "dev-1", `{"n": 3}`)
	var c twinConflict
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || r.code != exitConflict ||
		c != (twinConflict{Device: "dev-1", Error: "conflict", Want: read, Current: cur}) {
		t.Fatalf("%v %+v\n%s", err, c, r)
	}
	// 0: only if not written yet.
	if r := set("--if-version", "0", "dev-1", `{"n": 3}`); r.code != exitConflict {
		t.Fatal(r)
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("a refused set wrote:\nbefore %s\nafter  %s", before, after)
	}

	// The current version wins; 0 creates.
	if r := set("--if-version", fmt.Sprint(cur), "dev-1", `{"n": 3}`); r.code != 0 {
		t.Fatal(r)
	}
	if r := set("--if-version", "0", "dev-2", `{"n": 1}`); r.code != 0 {
		t.Fatal(r)
	}
	if d := e.getJSON("dev-1", "--config", e.config); d.Desired.Fields["n"] != 3.0 {
		t.Errorf("%+v", d)
	}
}

func TestTwinBadInput(t *testing.T) {
	e := newTwinEnv(t)
	if r := edgefence(t, "twin", "set", "--config", e.config, "dev-1", `{"keep": true}`); r.code != 0 {
		t.Fatal(r)
	}
	before := e.snapshot()
	deep := strings.Repeat(`{"a":`, 9) + "1" + strings.Repeat("}", 9)
	large := `{"blob": "` + strings.Repeat("x", shadow.DefaultMaxSize) + `"}`
	cfg := []string{"--config", e.config}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in stderr
	}{
		{"invalid JSON", []string{"set", "dev-1", `{"a": }`}, 1, []string{"invalid document", "JSON"}},
		{"not an object", []string{"set", "dev-1", `[1, 2]`}, 1, []string{"want an object, got an array"}},
		{"two objects", []string{"set", "dev-1", `{} {}`}, 1, []string{"data after the object"}},
		{"too deep", []string{"set", "dev-1", deep}, 1, []string{"too deeply nested", "8 levels"}},
		{"too large", []string{"set", "dev-1", large}, 1, []string{"too large", "limit 65536"}},
		{"unknown device set", []string{"set", "dev-9", `{"a": 1}`}, 1, []string{`unknown device "dev-9"`, "dev-1, dev-2"}},
		{"unknown device get", []string{"get", "dev-9"}, 1, []string{`unknown device "dev-9"`}},
		{"unknown device watch", []string{"watch", "dev-9"}, 1, []string{`unknown device "dev-9"`}},
		{"invalid device id", []string{"get", "bad/id"}, 1, []string{"bad/id"}},
		{"negative version", []string{"set", "--if-version", "-1", "dev-1", `{}`}, 2, []string{"if-version"}},
		{"missing JSON", []string{"set", "dev-1"}, 2, []string{"usage: edgefence twin set"}},
		{"two devices", []string{"get", "dev-1", "dev-2"}, 2, []string{"usage: edgefence twin get"}},
		{"no command", nil, 2, []string{"usage: edgefence twin"}},
		{"unknown command", []string{"del", "dev-1"}, 2, []string{`unknown command "del"`}},
		{"help", []string{"help"}, 0, nil},
		{"get help", []string{"get", "-h"}, 0, []string{"-etcd", "-prefix"}},
		{"bad prefix", []string{"get", "dev-1", "--prefix", "nope/"}, 1, []string{"--prefix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"twin"}, tc.args...)
			if len(tc.args) > 0 && tc.args[0] != "help" {
				args = append(args, cfg...)
			}
			r := edgefence(t, args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.code, r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("want %q in stderr\n%s", w, r)
				}
			}
		})
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("bad input wrote:\nbefore %s\nafter  %s", before, after)
	}

	// With --etcd alone the id must still be valid; an unreachable etcd
	// is an error, not a hang.
	if r := edgefence(t, "twin", "get", "--etcd", e.endpoint, ".hidden"); r.code != 1 || !strings.Contains(r.stderr, ".hidden") {
		t.Error(r)
	}
	if r := edgefence(t, "twin", "get", "--etcd", "http://127.0.0.1:1", "--timeout", "1s", "dev-1"); r.code != 1 ||
		!strings.Contains(r.stderr, "etcd http://127.0.0.1:1") {
		t.Error(r)
	}
}

// twinWatcher is `edgefence twin watch` running as a subprocess.
type twinWatcher struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
}

func startTwinWatch(t *testing.T, args ...string) *twinWatcher {
	t.Helper()
	return startWatcher(t, append([]string{"twin", "watch"}, args...)...)
}

// startWatcher runs edgefence with args (a command that prints until
// Ctrl-C: twin watch, job show --watch) as a subprocess.
func startWatcher(t *testing.T, args ...string) *twinWatcher {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), subprocEnv()...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &twinWatcher{cmd: cmd, lines: make(chan string, 100), stderr: new(bytes.Buffer)}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
			_ = cmd.Wait()
		}
	})
	return w
}

// next returns the next line printed that contains want.
func (w *twinWatcher) next(t *testing.T, want string) string {
	t.Helper()
	deadline := time.After(60 * time.Second) // a hang guard, not a latency bound
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				t.Fatalf("twin watch ended before printing %q; stderr: %s", want, w.stderr)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("twin watch printed no line with %q; stderr: %s", want, w.stderr)
		}
	}
}

// interrupt stops the watch as Ctrl-C does; it must exit 0.
func (w *twinWatcher) interrupt(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for range w.lines { // drain until stdout closes
	}
	if err := w.cmd.Wait(); err != nil {
		t.Errorf("twin watch after SIGINT: %v; stderr: %s", err, w.stderr)
	}
}

func TestTwinWatch(t *testing.T) {
	e := newTwinEnv(t)
	if r := edgefence(t, "twin", "set", "--config", e.config, "dev-1", `{"setpoint": 20}`, "--writer", "app"); r.code != 0 {
		t.Fatal(r)
	}
	js := startTwinWatch(t, "--config", e.config, "--json", "dev-1")
	human := startTwinWatch(t, "dev-1", "--etcd", e.endpoint, "--prefix", twinPrefix)

	// Both print the twin as they read it first.
	var l twinWatchLine
	if err := json.Unmarshal([]byte(js.next(t, `"kind":"sync"`)), &l); err != nil || l.Twin.Desired.Fields["setpoint"] != 20.0 {
		t.Fatalf("%v %+v", err, l)
	}
	if s := human.next(t, " sync "); !strings.Contains(s, `desired v`) || !strings.Contains(s, `{"setpoint":20}`) {
		t.Errorf("sync line %q", s)
	}

	// A concurrent set.
	r := edgefence(t, "twin", "set", "--config", e.config, "--writer", "bob", "dev-1", `{"setpoint": 21.5, "mode": "eco"}`)
	if r.code != 0 {
		t.Fatal(r)
	}
	line := js.next(t, `"kind":"put"`)
	l = twinWatchLine{}
	if err := json.Unmarshal([]byte(line), &l); err != nil || l.Side != "desired" || l.Changed["setpoint"] != nil ||
		l.Changed["/setpoint"] != 21.5 || l.Changed["/mode"] != "eco" || l.Twin.Desired.Meta["/mode"].By != "bob" ||
		l.Twin.Delta["mode"] != "eco" || l.Revision != l.Twin.Desired.Version || l.Time.IsZero() {
		t.Fatalf("%v %+v\n%s", err, l, line)
	}
	if s := human.next(t, " desired "); !strings.Contains(s, `/mode="eco" /setpoint=21.5  by bob  delta {"mode":"eco","setpoint":21.5}`) {
		t.Errorf("desired line %q", s)
	}

	// A reported change too, with the holder's token.
	token := e.report("dev-1", `{"setpoint": 21.5}`)
	l = twinWatchLine{}
	if err := json.Unmarshal([]byte(js.next(t, `"side":"reported"`)), &l); err != nil || l.Kind != "put" ||
		l.Changed["/setpoint"] != 21.5 || !shadow.Equal(l.Twin.Delta, map[string]any{"mode": "eco"}) {
		t.Fatalf("%v %+v", err, l)
	}
	if s := human.next(t, " reported "); !strings.Contains(s, fmt.Sprintf(`/setpoint=21.5  by gw-test token %d  delta {"mode":"eco"}`, token)) {
		t.Errorf("reported line %q", s)
	}

	// A deletion (etcdctl del), then Ctrl-C: exit 0.
	if _, err := e.etcd.Delete(t.Context(), twinPrefix+"/devices/dev-1/twin/desired"); err != nil {
		t.Fatal(err)
	}
	if s := human.next(t, " desired "); !strings.Contains(s, " deleted  delta {}") {
		t.Errorf("delete line %q", s)
	}
	js.interrupt(t)
	human.interrupt(t)
}
