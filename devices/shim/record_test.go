package shim_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// shimBucket is the bucket of the shim's marks, for the tests that edit
// the file behind the shim's back.
var shimBucket = []byte("shim.marks")

func rawMark(t *testing.T, path, dev string) []byte {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v []byte
	if err := db.View(func(tx *bbolt.Tx) error {
		v = bytes.Clone(tx.Bucket(shimBucket).Get([]byte(dev)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func putRawMark(t *testing.T, path, dev string, v []byte) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(shimBucket).Put([]byte(dev), v) }); err != nil {
		t.Fatal(err)
	}
}

func sameRecord(a, b shim.Record) bool {
	return a.Mark == b.Mark && a.At.Equal(b.At) && a.Holder == b.Holder && a.ID == b.ID
}

// A database the shim wrote before it stored fence.MarkRecord (a CBOR
// record without a checksum; testdata/README.md) opens and decides from its
// marks; a device's next write replaces its record with a MarkRecord, and
// the device not written since still reads from CBOR after a restart.
func TestOpenCBORDatabase(t *testing.T) {
	old, err := os.ReadFile("testdata/shim-cbor.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fence.db")
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if v := rawMark(t, path, "dev-1"); len(v) == 0 || v[0]>>5 != 5 {
		t.Fatalf("fixture's dev-1 record %x is not a CBOR map", v)
	}
	s, err := shim.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for dev, want := range map[string]shim.Record{
		"dev-1": {Mark: fence.Mark{Token: 5, Seq: 2}, Holder: "gw-a", ID: "a2"},
		"dev-2": {Mark: fence.Mark{Token: 9, Seq: 4}, Holder: "gw-b", ID: "b4"},
	} {
		r, err := s.Record(dev)
		if err != nil || r.Mark != want.Mark || r.Holder != want.Holder || r.ID != want.ID || r.At.IsZero() {
			t.Fatalf("%s: %+v %v, want %+v with a time", dev, r, err, want)
		}
	}
	rec := &recorder{}
	for _, c := range []struct {
		tok  fence.Token
		seq  uint64
		want fence.Verdict
	}{{5, 2, fence.Duplicate}, {4, 7, fence.Stale}, {5, 3, fence.Accepted}} {
		if a := s.Handle("dev-1", envelope(t, "dev-1", c.tok, c.seq, "ok"), rec); a.Verdict != c.want {
			t.Fatalf("dev-1 %d/%d: %+v, want %v", c.tok, c.seq, a, c.want)
		}
	}
	before, err := s.Record("dev-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var migrated fence.MarkRecord
	if err := migrated.UnmarshalBinary(rawMark(t, path, "dev-1")); err != nil || migrated.Mark != (fence.Mark{Token: 5, Seq: 3}) {
		t.Fatalf("dev-1 after a write: %+v %v, want a MarkRecord at 5/3", migrated, err)
	}
	if v := rawMark(t, path, "dev-2"); v[0]>>5 != 5 {
		t.Fatalf("dev-2, never written, was rewritten: %x", v)
	}
	s = open(t, path, nil)
	if r, err := s.Record("dev-2"); err != nil || !sameRecord(r, before) {
		t.Fatalf("dev-2 after a restart: %+v %v, want %+v", r, err, before)
	}
	if m := mark(t, s, "dev-1"); m != (fence.Mark{Token: 5, Seq: 3}) {
		t.Fatalf("dev-1 after a restart: %v", m)
	}
}

// A mark record that cannot be trusted (checksum, length, garbage, a CBOR
// record that does not decode or holds no mark) is never read as a zero
// mark: the device's commands are refused (Invalid, the mark untouched on
// disk), counted in CorruptMarks and StorageErrors; the other devices are
// served; Record reports ErrStorage and fence.ErrMarkRecordCorrupt.
func TestCorruptMarkRecord(t *testing.T) {
	for name, edit := range map[string]func([]byte) []byte{
		"token bit flipped":    func(b []byte) []byte { b[8] ^= 1; return b },
		"checksum bit flipped": func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b },
		"version bit flipped":  func(b []byte) []byte { b[0] ^= 0x20; return b },
		"truncated":            func(b []byte) []byte { return b[:len(b)-1] },
		"one byte":             func([]byte) []byte { return []byte{1} },
		"garbage":              func([]byte) []byte { return []byte(strings.Repeat("\xff", 40)) },
		"cbor cut short":       func([]byte) []byte { return []byte("\xa4\x01\xa2\x01\x05") },
		"cbor zero mark":       func([]byte) []byte { return []byte("\xa1\x01\xa2\x01\x00\x02\x00") },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fence.db")
			s := open(t, path, nil)
			for _, dev := range []string{"dev-1", "dev-2"} {
				if a := s.Handle(dev, envelope(t, dev, 5, 1, "ok"), counter{}); a.Verdict != fence.Accepted {
					t.Fatal(a)
				}
			}
			s.Close()
			bad := edit(rawMark(t, path, "dev-1"))
			putRawMark(t, path, "dev-1", bad)

			s = open(t, path, nil)
			for _, c := range []struct {
				tok fence.Token
				seq uint64
			}{{6, 1}, {5, 2}, {5, 1}, {4, 1}} {
				a := s.Handle("dev-1", envelope(t, "dev-1", c.tok, c.seq, "ok"), counter{})
				if a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "mark record corrupt") {
					t.Errorf("dev-1 %d/%d: %+v, want Invalid naming the corrupt record", c.tok, c.seq, a)
				}
			}
			if a := s.Handle("dev-2", envelope(t, "dev-2", 5, 2, "ok"), counter{}); a.Verdict != fence.Accepted {
				t.Errorf("other device: %+v", a)
			}
			if st := s.Stats(); st.CorruptMarks != 4 || st.StorageErrors != 4 || st.Invalid != 4 || st.Accepted != 1 {
				t.Errorf("stats %+v, want 4 corrupt marks, storage errors and invalid, 1 accepted", st)
			}
			if _, err := s.Record("dev-1"); !errors.Is(err, shim.ErrStorage) || !errors.Is(err, fence.ErrMarkRecordCorrupt) {
				t.Errorf("Record: %v, want ErrStorage and ErrMarkRecordCorrupt", err)
			}
			if c := counterOf(t, s, "dev-1"); c.n != 1 {
				t.Errorf("dev-1 applied %d commands, want only the first", c.n)
			}
			s.Close()
			if v := rawMark(t, path, "dev-1"); !bytes.Equal(v, bad) {
				t.Errorf("corrupt record overwritten: %x, was %x", v, bad)
			}
		})
	}
}
