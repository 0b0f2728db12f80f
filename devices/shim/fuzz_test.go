package shim_test

import (
	"path/filepath"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// FuzzHandle feeds arbitrary bytes to Handle: it must never panic, every ack
// must encode, and only an Accepted verdict may move the mark — to exactly
// the command's (token, seq), above where it was.
func FuzzHandle(f *testing.F) {
	const dev = "dev-f"
	valid := envelope(f, dev, 7, 3, "ok")
	huge := map[int]int{}
	for i := range 300 {
		huge[i] = i
	}
	hugeMap, _ := cbor.Marshal(huge)
	for _, seed := range [][]byte{
		valid,
		envelope(f, dev, 7, 4, "ok"),
		envelope(f, dev, 8, 1, "fail"),
		envelope(f, dev, 6, 9, "ok"),
		envelope(f, "dev-other", 9, 1, "ok"),
		envelope(f, dev, 9, 1, "panic"),
		valid[:len(valid)/2],
		nil,
		{0xff},
		{0xa0},
		{0xbf, 0xff}, // indefinite map
		hugeMap,
		[]byte("garbage"),
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	s := open(f, filepath.Join(f.TempDir(), "fence.db"), nil)
	f.Fuzz(func(t *testing.T, raw []byte, tx bool) {
		var d shim.Device = &recorder{}
		if tx {
			d = counter{}
		}
		before := mark(t, s, dev)
		ack := s.Handle(dev, raw, d)
		after := mark(t, s, dev)
		if _, err := fence.MarshalAck(&ack); err != nil {
			t.Fatalf("ack does not encode: %v (%+v)", err, ack)
		}
		if ack.Device != dev {
			t.Fatalf("ack device %q", ack.Device)
		}
		switch {
		case ack.Verdict == fence.Accepted:
			if after != (fence.Mark{Token: ack.Token, Seq: ack.Seq}) || !(before.Token < after.Token || before.Token == after.Token && before.Seq < after.Seq) {
				t.Fatalf("accepted %d/%d: mark %v → %v", ack.Token, ack.Seq, before, after)
			}
		case ack.Verdict == fence.Invalid && !tx && ack.Reason != "" && after != before:
			// An effect that fails after the commit consumes the command: the
			// one refusal that moves the mark, to exactly that command.
			if after != (fence.Mark{Token: ack.Token, Seq: ack.Seq}) {
				t.Fatalf("failed effect %d/%d: mark %v → %v", ack.Token, ack.Seq, before, after)
			}
		case after != before:
			t.Fatalf("%v (%s) moved the mark %v → %v", ack.Verdict, ack.Reason, before, after)
		}
		if ack.Mark() != after {
			t.Fatalf("ack mark %v, mark %v", ack.Mark(), after)
		}
	})
}
