package offline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// seedRecords are a pending record with a body, its terminal form keeping
// the body (version 1), and its terminal form without it (version 2).
func seedRecords(t testing.TB) (pending, kept, dropped record) {
	t.Helper()
	body, err := fence.EncodeBody(bytes.Repeat([]byte{7}, 2000))
	if err != nil {
		t.Fatal(err)
	}
	env := fence.Envelope{V: fence.Version, Device: "fw-1", Token: 7, Seq: 3, ID: "c-3", Kind: "fw.chunk", Body: body, Holder: "gw-a", IssuedAt: 1767225600123}
	raw, err := fence.MarshalEnvelope(&env)
	if err != nil {
		t.Fatal(err)
	}
	a := fence.NewAck(&env, fence.Accepted, fence.Mark{Token: 7, Seq: 3}, "")
	rawAck, err := fence.MarshalAck(&a)
	if err != nil {
		t.Fatal(err)
	}
	pending = record{pos: 3, created: 1767225600123, deadline: 1767229200123, env: raw}
	kept = pending
	kept.state, kept.resolved, kept.ack = fence.Accepted, 1767225601000, rawAck
	dropped = kept
	dropBody(&dropped, &env)
	if dropped.dropped == 0 {
		t.Fatal("dropBody kept a 2,003-byte body")
	}
	return pending, kept, dropped
}

// withCRC is b followed by its CRC-32C, as encode ends a record.
func withCRC(b []byte) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(nil), b...), crc32.Checksum(b, castagnoli))
}

// FuzzParseRecord: parseRecord never panics, fails only with ErrCorrupt,
// and accepts only what encode writes. The input is tried as a whole record
// and, so that the fuzzer gets past the checksum, with a valid one added.
func FuzzParseRecord(f *testing.F) {
	// parseRecord does not decode the CBOR inside: short stand-ins keep
	// the seeds small, which the fuzzer's minimization needs.
	pending := record{pos: 3, created: 1767225600123, deadline: 1767229200123, env: []byte("envelope")}
	kept := pending
	kept.state, kept.resolved, kept.ack = fence.Accepted, 1767225601000, []byte("ack")
	dropped := kept
	dropped.env, dropped.dropped, dropped.sum = []byte("stub"), 2003, sha256.Sum256([]byte("body"))
	for _, r := range []record{pending, kept, dropped} {
		v := r.encode()
		f.Add(v)
		f.Add(v[:len(v)-4])
	}
	f.Add([]byte{recordVersionDropped})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range [][]byte{b, withCRC(b)} {
			r, err := parseRecord(v)
			switch {
			case err != nil && !errors.Is(err, ErrCorrupt):
				t.Fatalf("%x: %v, not ErrCorrupt", v, err)
			case err != nil:
			case !bytes.Equal(r.encode(), v):
				t.Fatalf("%x parses, and encodes as %x", v, r.encode())
			case r.dropped != 0 && r.state == 0:
				t.Fatalf("%x: a pending record without its body", v)
			}
		}
	})
}

// A terminal record without its body: the stub with the body put back is
// the envelope that was sent, byte for byte, and the stored SHA-256 is the
// body's.
func TestDroppedBodyRebuildsSentEnvelope(t *testing.T) {
	ob, err := Open(filepath.Join(t.TempDir(), File), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	body, _ := fence.EncodeBody(bytes.Repeat([]byte("chunk"), 6000))
	e := &Entry{Envelope: fence.Envelope{V: fence.Version, Device: "fw-1", Token: 7, Seq: 1, ID: "c-1", Kind: "fw.chunk",
		Body: body, Holder: "gw-a", IssuedAt: 1767225600123}}
	if err := ob.Append(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	a := fence.NewAck(&e.Envelope, fence.Accepted, fence.Mark{Token: 7, Seq: 1}, "")
	if err := ob.Resolve("c-1", &a); err != nil {
		t.Fatal(err)
	}
	var v []byte
	ob.db.View(func(tx *bbolt.Tx) error { v = append(v, tx.Bucket(entriesBucket).Get([]byte("c-1"))...); return nil })
	r, err := parseRecord(v)
	if err != nil || v[0] != recordVersionDropped || r.dropped != uint32(len(body)) || r.sum != sha256.Sum256(body) {
		t.Fatalf("record version %d, dropped %d, sum %x: %v", v[0], r.dropped, r.sum, err)
	}
	stub, err := fence.UnmarshalEnvelope(r.env)
	if err != nil || stub.Body != nil {
		t.Fatalf("stub %+v %v", stub, err)
	}
	stub.Body = body
	sent, err := fence.MarshalEnvelope(stub)
	if err != nil || !bytes.Equal(sent, e.Raw) {
		t.Fatalf("stub + body is not the sent envelope (%v)", err)
	}
}

// Records that only a damaged or forged file holds are ErrCorrupt, from
// parseRecord and through Get; a stored stub with a bit flipped anywhere
// is too.
func TestCorruptDroppedRecord(t *testing.T) {
	_, kept, dropped := seedRecords(t)
	v1, v2 := kept.encode(), dropped.encode()
	zeroLen := append([]byte(nil), v2[:len(v2)-4]...)
	binary.BigEndian.PutUint32(zeroLen[len(zeroLen)-droppedTrailer:], 0)
	stubWithBody := dropped
	stubWithBody.env = kept.env
	pendingDropped := dropped
	pendingDropped.state, pendingDropped.resolved = 0, 0
	tooLong := dropped
	tooLong.dropped = fence.MaxBodySize + 1
	cases := map[string][]byte{
		"pending, body dropped":        pendingDropped.encode(),
		"version 2, dropped length 0":  withCRC(zeroLen),
		"version 2, no trailer":        withCRC(append([]byte{recordVersionDropped}, v1[1:len(v1)-4]...)),
		"version 2, trailer cut short": withCRC(v2[:len(v2)-8]),
		"version 1 with a trailer":     withCRC(append([]byte{recordVersion}, v2[1:len(v2)-4]...)),
		"dropped length over the max":  tooLong.encode(),
		"version 3":                    withCRC(append([]byte{3}, v2[1:len(v2)-4]...)),
	}
	for name, v := range cases {
		if _, err := parseRecord(v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	for off := range len(v2) * 8 {
		b := append([]byte(nil), v2...)
		b[off/8] ^= 1 << (off % 8)
		if _, err := parseRecord(b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("bit %d flipped: %v", off, err)
		}
	}
	cases["stub with a body"] = stubWithBody.encode() // parses; Get finds the contradiction

	ob, err := Open(filepath.Join(t.TempDir(), File), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	put := func(v []byte) {
		t.Helper()
		if err := ob.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(entriesBucket).Put([]byte("c-3"), v) }); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range cases { // under the envelope's own id
		put(v)
		if _, err := ob.Get("c-3"); !errors.Is(err, ErrCorrupt) {
			t.Errorf("get %q: %v, want ErrCorrupt", name, err)
		}
	}
	put(v2)
	if r, err := ob.Get("c-3"); err != nil || !r.BodyDropped || r.BodyBytes != int(dropped.dropped) {
		t.Errorf("get of a stub: %+v %v", r, err)
	}
}
