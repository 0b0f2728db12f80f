package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// longID is a command id as the agent makes them (32 hex digits); list
// prints its first 12.
const longID = "0123456789abcdef0123456789abcdef"

// outboxAt writes an outbox in dir as an agent would have left it and
// returns its path. Its clock stands 50h30m before now, so that every age
// prints as 2d02h for half an hour; the entries, a second apart:
//
//	pump-7   c-pump-7-1 accepted (its 2,003-byte body dropped), c-pump-7-2 stale,
//	         c-pump-7-3 (a 3-byte body) and -4 pending
//	meter-1  longID pending
//	drive.2  d-2-1 expired
func outboxAt(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, offline.File)
	t0 := time.Now().Add(-50*time.Hour - 30*time.Minute)
	ob, err := offline.Open(path, &offline.Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	for i, c := range []struct {
		dev, id string
		tok     fence.Token
		seq     uint64
		v       fence.Verdict
		reason  string
		body    []byte
	}{
		{"pump-7", "c-pump-7-1", 7, 1, fence.Accepted, "", make([]byte, 2000)},
		{"pump-7", "c-pump-7-2", 9, 1, fence.Stale, "token 9 below\n12", nil},
		{"pump-7", "c-pump-7-3", 12, 1, 0, "", []byte("on")},
		{"pump-7", "c-pump-7-4", 12, 2, 0, "", nil},
		{"meter-1", longID, 12, 1, 0, "", nil},
		{"drive.2", "d-2-1", 3, 40, fence.Expired, "", nil},
	} {
		e := &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: c.dev, Token: c.tok, Seq: c.seq, ID: c.id, Kind: "set"},
			Created: t0.Add(time.Duration(i-10) * time.Second), TTL: 7 * 24 * time.Hour}
		if c.body != nil {
			var err error
			if e.Envelope.Body, err = fence.EncodeBody(c.body); err != nil {
				t.Fatal(err)
			}
		}
		if c.v == fence.Expired {
			e.TTL = time.Second
		}
		if err := ob.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		if c.v != 0 && c.v != fence.Expired {
			ack := fence.NewAck(&e.Envelope, c.v, fence.Mark{Token: 12, Seq: 0}, c.reason)
			if err := ob.Resolve(c.id, &ack); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := ob.ExpireDue(); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	return path
}

// summaryRE is the pending summary of outboxAt's file: one device a line
// (it was one long line), and the total.
var summaryRE = regexp.MustCompile(`^DEVICE +PENDING +BYTES +OLDEST
meter-1 +1 +\d+ +2d02h
pump-7 +2 +\d+ +2d02h
\(total\) +3 +\d+ +2d02h$`)

func TestOutboxList(t *testing.T) {
	dir := t.TempDir()
	path := outboxAt(t, dir)

	// Pending by default, by device and queue position; a summary line.
	r := edgefence(t, "outbox", "list", "--file", path)
	want := "DEVICE   ID            TOKEN  SEQ  KIND  STATE    AGE    REASON\n" +
		"meter-1  0123456789ab  12     1    set   pending  2d02h  -\n" +
		"pump-7   c-pump-7-3    12     1    set   pending  2d02h  -\n" +
		"pump-7   c-pump-7-4    12     2    set   pending  2d02h  -\n" +
		"\n"
	if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, want) ||
		!summaryRE.MatchString(strings.TrimSuffix(strings.TrimPrefix(r.stdout, want), "\n")) {
		t.Fatalf("%s\nwant stdout:\n%s<summary>", r, want)
	}

	// Every state; the reason on one line.
	r = edgefence(t, "outbox", "list", "--file", path, "--state", "all")
	for _, line := range []string{
		"drive.2  d-2-1         3      40   set   expired   2d02h  -\n",
		"pump-7   c-pump-7-1    7      1    set   accepted  2d02h  -\n",
		"pump-7   c-pump-7-2    9      1    set   stale     2d02h  token 9 below 12\n",
	} {
		if r.code != 0 || !strings.Contains(r.stdout, line) {
			t.Errorf("%s\nwant line %q", r, line)
		}
	}
	if n := strings.Count(r.stdout, "\n"); n != 1+6+1+4 {
		t.Errorf("%d lines:\n%s", n, r.stdout)
	}

	// Filters: terminal only, one device, a limit; the summary follows --device.
	r = edgefence(t, "outbox", "list", "--file", path, "--state", "terminal", "--device", "pump-7", "--limit", "1")
	if r.code != 0 || !strings.Contains(r.stdout, "c-pump-7-1") || strings.Count(r.stdout, "\n") != 1+1+1+2 ||
		!regexp.MustCompile(`\n\nDEVICE +PENDING +BYTES +OLDEST\npump-7 +2 +\d+ +2d02h\n$`).MatchString(r.stdout) {
		t.Error(r)
	}

	// The outbox of a state dir, and of the agent a config file describes.
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(goodConfig+"state_dir: "+dir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, src := range [][]string{{"--state-dir", dir}, {"--config", cfg}} {
		r = edgefence(t, append([]string{"outbox", "list", "--json", "--state", "all"}, src...)...)
		var l agent.OutboxList
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || r.code != 0 || r.stderr != "" {
			t.Fatalf("%v\n%s", err, r)
		}
		if len(l.Records) != 6 || l.Records[0].Device != "drive.2" || l.Records[0].State != fence.Expired ||
			l.Records[5].ID != "c-pump-7-4" || l.Records[5].Pos != 4 || l.Summary.Pending != 3 || !l.Summary.ReadOnly ||
			l.Summary.OldestAge < 50*time.Hour {
			t.Errorf("%v: JSON %+v", src, l)
		}
		if !strings.Contains(r.stdout, `"state": "stale"`) || !strings.Contains(r.stdout, `"verdict": "stale"`) {
			t.Errorf("JSON layout:\n%s", r.stdout)
		}
	}

	// An outbox without entries, and a bbolt file the agent never set up.
	empty := filepath.Join(t.TempDir(), offline.File)
	db, err := bbolt.Open(empty, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if r := edgefence(t, "outbox", "list", "--file", empty); r.code != 0 ||
		r.stdout != "DEVICE  ID  TOKEN  SEQ  KIND  STATE  AGE  REASON\n\npending: none\n" {
		t.Error(r)
	}
	r = edgefence(t, "outbox", "list", "--file", empty, "--json")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "{\n  \"records\": [],\n  \"summary\": {") {
		t.Error(r)
	}
}

func TestOutboxShow(t *testing.T) {
	path := outboxAt(t, t.TempDir())

	// A terminal entry with its ack; the short id list prints; flags after.
	r := edgefence(t, "outbox", "show", "c-pump-7-2", "0123456789ab", "--file", path)
	for _, re := range []string{
		`(?m)^id        c-pump-7-2$`, `(?m)^device    pump-7$`, `(?m)^token     9$`, `(?m)^state     stale$`,
		`(?m)^created   \d{4}-\d\d-\d\dT[0-9:.]+Z \(2d02h ago\)$`, `(?m)^resolved  \d{4}-`,
		`(?m)^ack       stale: token 9 seq 1; fence point at token 12 seq 0$`, `(?m)^reason    token 9 below 12$`,
		`(?m)^id        ` + longID + `$`, `(?m)^ack       - \(pending\)$`, `(?m)^body      none$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("no %s in\n%s", re, r)
		}
	}
	if r.code != 0 || r.stderr != "" || strings.Count(r.stdout, "\nid ") != 1 {
		t.Error(r)
	}
	if r := edgefence(t, "outbox", "show", "--file", path, "d-2-1"); r.code != 0 || !strings.Contains(r.stdout, "expired in the outbox") {
		t.Error(r)
	}

	r = edgefence(t, "outbox", "show", "--json", "--file", path, "c-pump-7-1")
	var recs []offline.Record
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil || r.code != 0 {
		t.Fatalf("%v\n%s", err, r)
	}
	if len(recs) != 1 || recs[0].State != fence.Accepted || recs[0].Ack == nil || recs[0].Ack.Verdict != fence.Accepted {
		t.Errorf("%+v", recs)
	}

	// A body: its size; dropped once the entry ended, with its SHA-256.
	body, _ := fence.EncodeBody(make([]byte, 2000))
	sum := sha256.Sum256(body)
	if len(recs) == 1 && (recs[0].BodyBytes != 2003 || !recs[0].BodyDropped || !bytes.Equal(recs[0].BodySHA256, sum[:])) {
		t.Errorf("JSON body: %d bytes, dropped %v, sha256 %x; want 2003, true, %x", recs[0].BodyBytes, recs[0].BodyDropped, recs[0].BodySHA256, sum)
	}
	r = edgefence(t, "outbox", "show", "--file", path, "c-pump-7-1", "c-pump-7-3")
	for _, re := range []string{
		fmt.Sprintf(`(?m)^body      2003 bytes \(dropped at accepted, sha256 %x\)$`, sum), `(?m)^body      3 bytes$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("no %s in\n%s", re, r)
		}
	}

	// Unknown and ambiguous ids: the others still print, exit 1.
	r = edgefence(t, "outbox", "show", "--file", path, "c-pump-7-3", "nope", "c-pump")
	if r.code != 1 || !strings.Contains(r.stdout, "c-pump-7-3") || !strings.Contains(r.stderr, "nope: no such entry") ||
		!strings.Contains(r.stderr, "several entries") {
		t.Error(r)
	}
}

func TestOutboxErrors(t *testing.T) {
	dir := t.TempDir()
	path := outboxAt(t, dir)
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a bbolt file\n", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no command", []string{"outbox"}, 2, "usage: edgefence outbox"},
		{"unknown command", []string{"outbox", "drop"}, 2, `unknown command "drop"`},
		{"help", []string{"outbox", "-h"}, 0, ""},
		{"list help", []string{"outbox", "list", "-h"}, 0, "-state"},
		{"bad flag", []string{"outbox", "list", "--fiel", path}, 2, "-fiel"},
		{"bad state", []string{"outbox", "list", "--file", path, "--state", "done"}, 2, `--state "done"`},
		{"bad limit", []string{"outbox", "list", "--file", path, "--limit", "-1"}, 2, "usage"},
		{"list with arguments", []string{"outbox", "list", "--file", path, "c-pump-7-1"}, 2, "usage"},
		{"show without ids", []string{"outbox", "show", "--file", path}, 2, "usage"},
		{"file and config", []string{"outbox", "list", "--file", path, "--config", path}, 2, "usage"},
		{"state dir and config", []string{"outbox", "list", "--state-dir", dir, "--config", path}, 2, "usage"},
		{"missing file", []string{"outbox", "list", "--file", filepath.Join(dir, "nope.db")}, 1, "no such file"},
		{"empty state dir", []string{"outbox", "list", "--state-dir", t.TempDir()}, 1, "no agent has kept an outbox there"},
		{"bad config", []string{"outbox", "list", "--config", filepath.Join(dir, "nope.yaml")}, 1, "nope.yaml"},
		{"not an outbox", []string{"outbox", "list", "--file", garbage}, 1, "outbox record corrupt"},
		{"no agent on the socket", []string{"outbox", "list", "--socket", filepath.Join(dir, "nope.sock")}, 6, "is edgefence running?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := edgefence(t, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s\nwant exit %d and %q in stderr", r, tc.code, tc.want)
			}
		})
	}

	// A running agent holds the file: time out with the hint, not hang.
	t.Run("held by an agent", func(t *testing.T) {
		ob, err := offline.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		r := edgefence(t, "outbox", "list", "--file", path, "--timeout", "200ms")
		if r.code != 1 || !strings.Contains(r.stderr, "another process holds the outbox") ||
			!strings.Contains(r.stderr, "ask the agent") || r.stdout != "" {
			t.Error(r)
		}
	})

	// A corrupt record: the readable ones print, the bad one is named, exit 1.
	t.Run("corrupt record", func(t *testing.T) {
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket([]byte("outbox.entries")).Put([]byte(longID), []byte("garbage"))
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		r := edgefence(t, "outbox", "list", "--file", path)
		if r.code != 1 || !strings.Contains(r.stdout, "c-pump-7-3") || strings.Contains(r.stdout, "0123456789ab ") ||
			!strings.Contains(r.stderr, longID) || !strings.Contains(r.stderr, "corrupt") {
			t.Error(r)
		}
		r = edgefence(t, "outbox", "show", "--file", path, longID)
		if r.code != 1 || !strings.Contains(r.stderr, "corrupt") {
			t.Error(r)
		}
	})
}

// While an agent holds the outbox, --config reaches it over its socket: the
// same records as from the file, read by the agent.
func TestOutboxViaAgent(t *testing.T) {
	dir := t.TempDir()
	path := outboxAt(t, dir)
	w := newAPIWorld(t, dir)
	serve := func(name string, ob *offline.Outbox) (cfgPath, sock string) {
		t.Helper()
		return w.serve(name, "  - id: pump-7\n    auth: off\n", agent.Options{Outbox: ob})
	}

	ob, err := offline.Open(path, nil) // the agent's lock
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	cfg, sock := serve("with", ob)

	r := edgefence(t, "outbox", "list", "--config", cfg, "--timeout", "100ms")
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "pump-7   c-pump-7-4    12     2    set   pending  2d02h  -\n") ||
		!summaryRE.MatchString(strings.TrimSpace(r.stdout[strings.LastIndex(r.stdout, "\n\n")+2:])) {
		t.Fatal(r)
	}
	r = edgefence(t, "outbox", "list", "--socket", sock, "--json", "--state", "all", "--device", "pump-7")
	var l agent.OutboxList
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || r.code != 0 || len(l.Records) != 4 ||
		l.Records[1].Reason() != "token 9 below\n12" || l.Summary.Pending != 2 || l.Summary.ReadOnly {
		t.Fatalf("%+v %v\n%s", l, err, r)
	}
	r = edgefence(t, "outbox", "show", "--config", cfg, "--timeout", "100ms", "0123456789ab", "nope")
	if r.code != 1 || !strings.Contains(r.stdout, "id        "+longID) || !strings.Contains(r.stderr, "nope: no such entry") {
		t.Error(r)
	}
}

// End to end: `edgefence run` keeps its outbox in <state_dir>; a command
// sent through it shows up as accepted in `outbox list --config`, which
// asks the running agent (it holds the file), and `outbox show` prints its
// ack. After the agent stopped, the same commands read the file.
func TestOutboxRunningAgent(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 10*time.Second)
	p := e.startAgent("gw-1", cfg)
	e.waitHolding(p, sock)
	r := edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":22}`)
	if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" {
		t.Fatalf("send: %+v\n%s", res, r)
	}

	list := func() agent.OutboxList {
		t.Helper()
		r := edgefence(t, "outbox", "list", "--config", cfg, "--state", "all", "--json", "--timeout", "100ms")
		var l agent.OutboxList
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || r.code != 0 {
			t.Fatalf("%v\n%s", err, r)
		}
		return l
	}
	l := list()
	if len(l.Records) != 1 || l.Records[0].Device != "dev-1" || l.Records[0].State != fence.Accepted ||
		l.Records[0].Ack == nil || l.Summary.Pending != 0 || l.Summary.ReadOnly {
		t.Fatalf("outbox via the agent: %+v", l)
	}
	id := l.Records[0].ID
	r = edgefence(t, "outbox", "show", "--config", cfg, "--timeout", "100ms", id[:12])
	if r.code != 0 || !strings.Contains(r.stdout, "id        "+id+"\n") || !strings.Contains(r.stdout, "ack       accepted: token ") {
		t.Fatal(r)
	}
	if r := edgefence(t, "outbox", "list", "--config", cfg, "--timeout", "100ms"); r.code != 0 || !strings.HasSuffix(r.stdout, "\npending: none\n") {
		t.Error(r)
	}

	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	l = list() // from the file now
	if len(l.Records) != 1 || l.Records[0].ID != id || l.Records[0].State != fence.Accepted || !l.Summary.ReadOnly {
		t.Errorf("outbox from the file: %+v", l)
	}
}
