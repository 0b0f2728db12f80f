package offline_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// A read-only open of a missing file fails and creates nothing; a bbolt
// file without the outbox's buckets reads as an empty outbox.
func TestReadOnlyMissingAndEmpty(t *testing.T) {
	path := dbPath(t)
	if _, err := offline.Open(path, &offline.Options{ReadOnly: true}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open of a missing file: %v, want not exist", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("read-only open created the file")
	}

	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	ob := open(t, path, &offline.Options{ReadOnly: true})
	if !ob.ReadOnly() {
		t.Error("ReadOnly() is false")
	}
	if recs, err := ob.List(offline.Filter{}); err != nil || len(recs) != 0 {
		t.Errorf("List: %v %v", recs, err)
	}
	if recs, err := ob.List(offline.Filter{PendingOnly: true, Device: "d"}); err != nil || len(recs) != 0 {
		t.Errorf("List pending: %v %v", recs, err)
	}
	if _, err := ob.Get("c"); !errors.Is(err, offline.ErrNotFound) {
		t.Errorf("Get: %v", err)
	}
	if _, err := ob.Find("c"); !errors.Is(err, offline.ErrNotFound) {
		t.Errorf("Find: %v", err)
	}
	if _, ok, err := ob.Next("d"); ok || err != nil {
		t.Errorf("Next: %v %v", ok, err)
	}
	if s, err := ob.Stats(); err != nil || s.Pending != 0 || len(s.Terminal) != 0 {
		t.Errorf("Stats: %+v %v", s, err)
	}
	if s, err := ob.Summary(""); err != nil || s.Pending != 0 || len(s.Devices) != 0 || !s.ReadOnly {
		t.Errorf("Summary: %+v %v", s, err)
	}
	if tok, err := ob.Held("d"); err != nil || tok != 0 {
		t.Errorf("Held: %v %v", tok, err)
	}
	if err := ob.Append(context.Background(), entry("d", "c", 1, 1)); !errors.Is(err, offline.ErrReadOnly) {
		t.Errorf("Append: %v", err)
	}
	ob.Close()

	// Nothing was created: the file still has no buckets.
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
			t.Errorf("read-only open created bucket %s", name)
			return nil
		})
	})
}

// A read-only Outbox reads what an agent left, refuses every write with
// ErrReadOnly, and changes nothing in the file.
func TestReadOnlyReadsAndRefusesWrites(t *testing.T) {
	path := dbPath(t)
	clk := newClock()
	ob := open(t, path, &offline.Options{Now: clk.Now})
	for i, id := range []string{"a1", "a2", "a3"} {
		appendOK(t, ob, entry("dev-a", id, 5, uint64(i+1)))
		clk.Advance(time.Second)
	}
	b1 := entry("dev-b", "b1", 6, 1)
	appendOK(t, ob, b1)
	if err := ob.Resolve("a1", ack(entry("dev-a", "a1", 5, 1), fence.Stale, "token 5 below 7")); err != nil {
		t.Fatal(err)
	}
	if err := ob.SetHeld("dev-a", 5); err != nil {
		t.Fatal(err)
	}
	want, err := ob.List(offline.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ob.Close()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	clk.Advance(time.Minute)
	ro := open(t, path, &offline.Options{ReadOnly: true, Now: clk.Now})
	ro2 := open(t, path, &offline.Options{ReadOnly: true, Now: clk.Now}) // readers share the lock
	got, err := ro.List(offline.Filter{})
	if err != nil || len(got) != len(want) {
		t.Fatalf("List: %v %v", got, err)
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].State != want[i].State || got[i].Age != want[i].Age+time.Minute {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if r, err := ro2.Get("a1"); err != nil || r.State != fence.Stale || r.Reason() != "token 5 below 7" {
		t.Errorf("Get: %+v %v", r, err)
	}
	if e, ok, err := ro.Next("dev-a"); err != nil || !ok || e.Envelope.ID != "a2" {
		t.Errorf("Next: %+v %v %v", e, ok, err)
	}
	if n, b := ro.Pending("dev-a"); n != 2 || b == 0 {
		t.Errorf("Pending: %d %d", n, b)
	}
	if tok, err := ro.Held("dev-a"); err != nil || tok != 5 {
		t.Errorf("Held: %v %v", tok, err)
	}

	ctx := context.Background()
	for name, err := range map[string]error{
		"Append":            ro.Append(ctx, entry("dev-a", "a4", 5, 4)),
		"Resolve":           ro.Resolve("b1", ack(b1, fence.Accepted, "")),
		"Resolve (bad ack)": ro.Resolve("b1", nil),
		"ExpireDue":         func() error { _, err := ro.ExpireDue(); return err }(),
		"Compact":           func() error { _, err := ro.Compact(); return err }(),
		"SetHeld":           ro.SetHeld("dev-a", 9),
	} {
		if !errors.Is(err, offline.ErrReadOnly) {
			t.Errorf("%s on a read-only outbox: %v, want ErrReadOnly", name, err)
		}
	}
	ro.Close()
	ro2.Close()
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("the read-only outbox changed the file")
	}
}

// While an agent holds the file a read-only open waits Timeout and fails
// with ErrLocked and the hint to ask the agent; while a reader holds it,
// the agent's open waits likewise.
func TestReadOnlyLocked(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, nil)
	start := time.Now()
	_, err := offline.Open(path, &offline.Options{ReadOnly: true, Timeout: 100 * time.Millisecond})
	if !errors.Is(err, offline.ErrLocked) || !strings.Contains(err.Error(), "ask the agent") {
		t.Fatalf("read-only open of a held file: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("read-only open gave up after %v, want about the 100ms timeout", d)
	}
	ob.Close()

	open(t, path, &offline.Options{ReadOnly: true})
	if _, err := offline.Open(path, &offline.Options{Timeout: 100 * time.Millisecond}); !errors.Is(err, offline.ErrLocked) {
		t.Fatalf("open for writing while a reader holds the file: %v", err)
	}
}

// A file that is not a bbolt database is ErrCorrupt, read-only or not.
func TestOpenNotADatabase(t *testing.T) {
	path := dbPath(t)
	if err := os.WriteFile(path, []byte(strings.Repeat("not a bbolt file\n", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		if _, err := offline.Open(path, &offline.Options{ReadOnly: ro}); !errors.Is(err, offline.ErrCorrupt) {
			t.Errorf("read-only %v: %v, want ErrCorrupt", ro, err)
		}
	}
}

func TestListFilterAndFind(t *testing.T) {
	ob := open(t, dbPath(t), nil)
	ids := []string{"0a11", "0a12", "0b21", "0b22", "0c31"}
	var es []*offline.Entry
	for i, id := range ids {
		e := entry("dev-"+id[1:2], id, 3, uint64(i+1))
		appendOK(t, ob, e)
		es = append(es, e)
	}
	if err := ob.Resolve("0a11", ack(es[0], fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	if err := ob.Resolve("0b22", ack(es[3], fence.Duplicate, "")); err != nil {
		t.Fatal(err)
	}
	idsOf := func(recs []offline.Record, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, r := range recs {
			s = append(s, r.ID)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		f    offline.Filter
		want string
	}{
		{offline.Filter{}, "0a11 0a12 0b21 0b22 0c31"},
		{offline.Filter{PendingOnly: true}, "0a12 0b21 0c31"},
		{offline.Filter{TerminalOnly: true}, "0a11 0b22"},
		{offline.Filter{PendingOnly: true, TerminalOnly: true}, ""},
		{offline.Filter{Device: "dev-b"}, "0b21 0b22"},
		{offline.Filter{Device: "dev-b", TerminalOnly: true}, "0b22"},
		{offline.Filter{Limit: 2}, "0a11 0a12"},
		{offline.Filter{PendingOnly: true, Limit: 2}, "0a12 0b21"},
		{offline.Filter{TerminalOnly: true, Limit: 1}, "0a11"},
		{offline.Filter{Device: "dev-z"}, ""},
	} {
		if got := idsOf(ob.List(tc.f)); got != tc.want {
			t.Errorf("List(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}

	for _, tc := range []struct {
		id, want string
		err      error
	}{
		{"0b22", "0b22", nil},
		{"0b2", "", offline.ErrAmbiguous},
		{"0c", "0c31", nil},
		{"0", "", offline.ErrAmbiguous},
		{"1", "", offline.ErrNotFound},
		{"", "", offline.ErrNotFound},
	} {
		r, err := ob.Find(tc.id)
		if !errors.Is(err, tc.err) || r.ID != tc.want {
			t.Errorf("Find(%q) = %q, %v; want %q, %v", tc.id, r.ID, err, tc.want, tc.err)
		}
	}
}

func TestSummary(t *testing.T) {
	clk := newClock()
	ob := open(t, dbPath(t), &offline.Options{Now: clk.Now})
	a1 := entry("dev-a", "a1", 1, 1)
	appendOK(t, ob, a1)
	clk.Advance(10 * time.Second)
	appendOK(t, ob, entry("dev-a", "a2", 1, 2))
	appendOK(t, ob, entry("dev-b", "b1", 1, 1))
	clk.Advance(5 * time.Second)
	s, err := ob.Summary("")
	if err != nil {
		t.Fatal(err)
	}
	na, ba := ob.Pending("dev-a")
	if s.Pending != 3 || len(s.Devices) != 2 || s.Devices[0].Device != "dev-a" || s.Devices[0].Pending != na ||
		s.Devices[0].Bytes != ba || s.Devices[0].OldestAge != 15*time.Second || s.Devices[1].OldestAge != 5*time.Second ||
		s.OldestAge != 15*time.Second || s.Bytes != s.Devices[0].Bytes+s.Devices[1].Bytes || s.ReadOnly {
		t.Errorf("summary %+v", s)
	}
	// Resolving the head moves the oldest to the next entry.
	if err := ob.Resolve("a1", ack(a1, fence.Accepted, "")); err != nil {
		t.Fatal(err)
	}
	if s, err := ob.Summary("dev-a"); err != nil || len(s.Devices) != 1 || s.Pending != 1 || s.OldestAge != 5*time.Second {
		t.Errorf("summary of dev-a %+v %v", s, err)
	}
	if s, err := ob.Summary("dev-z"); err != nil || len(s.Devices) != 0 || s.Pending != 0 || !s.Oldest.IsZero() {
		t.Errorf("summary of dev-z %+v %v", s, err)
	}
}

// The JSON forms round-trip and name states and verdicts.
func TestRecordJSON(t *testing.T) {
	clk := newClock()
	ob := open(t, dbPath(t), &offline.Options{Now: clk.Now})
	e := entry("dev-a", "a1", 4, 2)
	e.Envelope.Body = bodyOf(t, 2000, 1) // dropped once stale
	appendOK(t, ob, e)
	e2 := entry("dev-a", "a2", 4, 3)
	e2.Envelope.Body = []byte{0x42, 'o', 'n'}
	appendOK(t, ob, e2)
	clk.Advance(1500 * time.Millisecond)
	a := ack(e, fence.Stale, "token 4 below 5")
	a.MaxToken, a.LastSeq = 5, 1
	if err := ob.Resolve("a1", a); err != nil {
		t.Fatal(err)
	}
	recs, err := ob.List(offline.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(recs)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"state":"stale"`, `"state":"pending"`, `"verdict":"stale"`, `"max_token":5`, `"age_ms":1500`,
		`"reason":"token 4 below 5"`, `"created":"2026-01-02T03:04:05Z"`, `"body_bytes":2000,"body_dropped":true,"body_sha256":"` +
			fmt.Sprintf("%x", sha256.Sum256(e.Envelope.Body)) + `"`, `"body_bytes":3}`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("%s not in %s", s, b)
		}
	}
	var back []offline.Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		recs[i].Created, recs[i].Deadline, recs[i].Resolved = recs[i].Created.UTC(), recs[i].Deadline.UTC(), recs[i].Resolved.UTC()
	}
	if !reflect.DeepEqual(back, recs) {
		t.Errorf("round trip:\n%+v\nwant\n%+v", back, recs)
	}

	s, err := ob.Summary("")
	if err != nil {
		t.Fatal(err)
	}
	b, err = json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"oldest_age_ms":1500`) || !strings.Contains(string(b), `"pending":1`) {
		t.Errorf("summary JSON %s", b)
	}
	var s2 offline.Summary
	if err := json.Unmarshal(b, &s2); err != nil || s2.OldestAge != 1500*time.Millisecond || len(s2.Devices) != 1 ||
		s2.Devices[0].OldestAge != s.Devices[0].OldestAge || !s2.Oldest.Equal(s.Oldest) {
		t.Errorf("summary round trip %+v %v", s2, err)
	}
}
