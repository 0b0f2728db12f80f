package shim_test

import (
	"errors"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// TestUpdate: a device's own write transaction commits beside the marks,
// leaves them alone, is rolled back by an error, and is refused after
// Close.
func TestUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	s := open(t, path, nil)
	if ack := s.Handle("dev-u", envelope(t, "dev-u", 4, 1, "ok"), counter{}); ack.Verdict != fence.Accepted {
		t.Fatalf("%+v", ack)
	}
	put := func(v string, fail error) error {
		return s.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("test.own"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte("k"), []byte(v)); err != nil {
				return err
			}
			return fail
		})
	}
	boom := errors.New("boom")
	if err := put("one", nil); err != nil {
		t.Fatal(err)
	}
	if err := put("two", boom); !errors.Is(err, boom) {
		t.Fatalf("Update returned %v", err)
	}
	var got string
	if err := s.View(func(tx *bbolt.Tx) error { got = string(tx.Bucket([]byte("test.own")).Get([]byte("k"))); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != "one" || mark(t, s, "dev-u") != (fence.Mark{Token: 4, Seq: 1}) {
		t.Fatalf("value %q, mark %v", got, mark(t, s, "dev-u"))
	}
	s.Close()
	if err := put("three", nil); !errors.Is(err, shim.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
