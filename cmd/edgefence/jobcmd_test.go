package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
)

// jobCLI runs edgefence job with the env's config.
func (e *twinEnv) job(args ...string) result {
	e.t.Helper()
	if len(args) == 0 {
		return edgefence(e.t, "job")
	}
	return edgefence(e.t, append([]string{"job", args[0], "--config", e.config}, args[1:]...)...)
}

func TestJobCreateListShow(t *testing.T) {
	e := newTwinEnv(t)
	img := filepath.Join(t.TempDir(), "fw-2.bin")
	body := []byte(strings.Repeat("firmware", 1000))
	if err := os.WriteFile(img, body, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	r := e.job("create", "--id", "fw-2", "--image", img, "--version", "2", "--devices", "dev-1,dev-2",
		"--max-concurrent", "1", "--canary", "1", "--abort-ratio", "0.2", "--abort-min", "5", "--step-timeout", "90s", "--json")
	if r.code != 0 {
		t.Fatal(r)
	}
	var v jobView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	if v.Job.Image.SHA256 != hex.EncodeToString(sum[:]) || v.Job.Image.Size != uint64(len(body)) || v.Job.Image.URL != "file://"+img ||
		v.Job.Image.Name != "fw-2.bin" || v.Rollout.Status != jobs.RolloutActive || v.Rollout.CanaryLeft != 1 || v.Job.By == "" {
		t.Fatalf("created %+v", v)
	}
	if r := e.job("create", "--id", "fw-2", "--image", img, "--version", "2", "--devices", "dev-1"); r.code != 1 || !strings.Contains(r.stderr, "exists") {
		t.Errorf("second create: %v", r)
	}
	// --file: a job document.
	doc := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(doc, []byte(`{"id":"fw-3","image":{"sha256":"`+strings.Repeat("cd", 32)+`","size":10,"version":3,"url":"http://images.local/fw-3.bin","name":"fw-3"},"targets":{"match":["dev-*"]},"rollout":{"per_minute":5}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.job("create", "--file", doc); r.code != 0 || !strings.Contains(r.stdout, "job fw-3 created: fw-3 v3") {
		t.Fatal(r)
	}
	r = e.job("list")
	if r.code != 0 || !strings.Contains(r.stdout, "fw-2") || !strings.Contains(r.stdout, "fw-3") || !strings.Contains(r.stdout, "fw-2.bin") {
		t.Fatal(r)
	}
	// An execution, written as a gateway would.
	e.runExecution("dev-1", "fw-2", 4000)
	r = e.job("show", "fw-2")
	for _, want := range []string{"job fw-2: fw-2.bin v2", "2 devices dev-1,dev-2", "rollout: active", "canary 1 (1 left, 1 running)",
		"in_progress 1", "dev-1", "in_progress (canary)", "downloading", "4000/8000 50%", "gw-a"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, r)
		}
	}
	r = e.job("show", "--json", "fw-2")
	v = jobView{}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || len(v.Executions) != 1 || v.Executions[0].Bytes != 4000 {
		t.Fatalf("%v %+v\n%s", err, v, r)
	}
}

// runExecution queues and starts dev's execution of job under a real lock
// and records bytes of progress.
func (e *twinEnv) runExecution(dev, job string, bytes uint64) {
	t := e.t
	t.Helper()
	st := jobs.NewStore(e.etcd, twinPrefix)
	sess, err := concurrency.NewSession(e.etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	m := concurrency.NewMutex(sess, st.LockPrefix(dev))
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	own, err := e.etcd.Get(t.Context(), m.Key())
	if err != nil || len(own.Kvs) != 1 {
		t.Fatalf("read own lock key: %v %v", own, err)
	}
	h := jobs.Holder{Gateway: "gw-a", LockKey: m.Key(), Token: fence.Token(own.Kvs[0].CreateRevision)}
	x, err := st.Queue(t.Context(), dev, job, h)
	if err != nil {
		t.Fatal(err)
	}
	if x, err = st.Start(t.Context(), x, h); err != nil {
		t.Fatal(err)
	}
	x.Step, x.Bytes, x.Size = "downloading", bytes, 2*bytes
	if _, err = st.Update(t.Context(), x, h); err != nil {
		t.Fatal(err)
	}
}

func TestJobPauseResumeCancel(t *testing.T) {
	e := newTwinEnv(t)
	if r := e.job("create", "--id", "fw-1", "--sha256", strings.Repeat("ab", 32), "--size", "100", "--url", "file:///srv/fw.bin", "--version", "1", "--match", "dev-*"); r.code != 0 {
		t.Fatal(r)
	}
	steps := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"resume", "fw-1"}, 1, "active → active"},
		{[]string{"pause", "--reason", "night", "fw-1"}, 0, "rollout paused"},
		{[]string{"pause", "fw-1"}, 1, "paused → paused"},
		{[]string{"resume", "fw-1"}, 0, "rollout active"},
		{[]string{"cancel", "fw-1", "--reason", "wrong image"}, 0, "rollout canceled"},
		{[]string{"resume", "fw-1"}, 1, "canceled → active"},
		{[]string{"pause", "nope"}, 1, "no such job"},
		{[]string{"pause"}, 2, "usage"},
	}
	for _, s := range steps {
		r := e.job(s.args...)
		if r.code != s.code || !strings.Contains(r.stdout+r.stderr, s.want) {
			t.Errorf("want exit %d and %q: %v", s.code, s.want, r)
		}
	}
	r := e.job("show", "--json", "fw-1")
	var v jobView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Rollout.Status != jobs.RolloutCanceled || v.Rollout.Reason != "wrong image" {
		t.Fatalf("%v %+v", err, v)
	}
}

func TestJobBadInput(t *testing.T) {
	e := newTwinEnv(t)
	good := []string{"--sha256", strings.Repeat("ab", 32), "--size", "100", "--url", "file:///x", "--version", "1", "--devices", "dev-1"}
	doc := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(doc, []byte(`{"id":"fw-1","imag":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no id", append([]string{"create"}, good...), 1, "job id"},
		{"bad sha", []string{"create", "--id", "x", "--sha256", "zz", "--size", "1", "--url", "file:///x", "--devices", "d"}, 1, "sha256"},
		{"no targets", []string{"create", "--id", "x", "--sha256", strings.Repeat("ab", 32), "--size", "1", "--url", "file:///x"}, 1, "no targets"},
		{"ratio", append([]string{"create", "--id", "x", "--abort-ratio", "2"}, good...), 1, "failure_ratio"},
		{"missing image", []string{"create", "--id", "x", "--image", "/nonexistent", "--devices", "d"}, 1, "no such file"},
		{"image mismatch", append([]string{"create", "--id", "x", "--image", doc}, good...), 1, "does not match"},
		{"unknown field", []string{"create", "--file", doc}, 1, `unknown field "imag"`},
		{"file and flags", []string{"create", "--file", doc, "--id", "y"}, 2, "drop --id"},
		{"stray arg", []string{"create", "x"}, 2, "usage"},
		{"show two", []string{"show", "a", "b"}, 2, "usage"},
		{"show bad id", []string{"show", "a/b"}, 1, "job id"},
		{"show none", []string{"show", "nope"}, 1, "no such job"},
		{"unknown sub", []string{"frobnicate"}, 2, "usage: edgefence job"},
	} {
		r := e.job(c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("%s: want exit %d and %q: %v", c.name, c.code, c.want, r)
		}
	}
	if r := e.job("list"); r.code != 0 || !strings.Contains(r.stdout, "no jobs") {
		t.Errorf("bad input wrote a job: %v", r)
	}
	if r := edgefence(t, "job", "list", "--etcd", "http://127.0.0.1:1", "--timeout", "1s"); r.code != 1 || !strings.Contains(r.stderr, "etcd http://127.0.0.1:1") {
		t.Error(r)
	}
}

func TestJobShowWatch(t *testing.T) {
	e := newTwinEnv(t)
	if r := e.job("create", "--id", "fw-1", "--sha256", strings.Repeat("ab", 32), "--size", "100", "--url", "file:///srv/fw.bin", "--version", "1", "--devices", "dev-1,dev-2"); r.code != 0 {
		t.Fatal(r)
	}
	js := startWatcher(t, "job", "show", "--watch", "--json", "--config", e.config, "fw-1")
	human := startWatcher(t, "job", "show", "--watch", "fw-1", "--etcd", e.endpoint, "--prefix", twinPrefix)
	var l struct {
		Time time.Time `json:"time"`
		jobView
	}
	if err := json.Unmarshal([]byte(js.next(t, `"status":"active"`)), &l); err != nil || l.Time.IsZero() || l.Job.ID != "fw-1" {
		t.Fatalf("%v %+v", err, l)
	}
	human.next(t, "rollout: active")
	e.runExecution("dev-1", "fw-1", 50)
	js.next(t, `"bytes":50`)
	human.next(t, "50/100 50%")
	if r := e.job("pause", "fw-1", "--reason", "lunch"); r.code != 0 {
		t.Fatal(r)
	}
	js.next(t, `"reason":"lunch"`)
	human.next(t, "rollout: paused (lunch)")
	js.interrupt(t)
	human.interrupt(t)
}
