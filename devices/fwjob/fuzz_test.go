package fwjob_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// FuzzBody feeds arbitrary bodies of every firmware kind to a device:
// Handle never panics, a refusal moves neither the mark nor the firmware
// state, and an accepted step moves the mark to the command and leaves a
// state of the machine with the bytes within the image.
func FuzzBody(f *testing.F) {
	im := small
	seeds := []any{
		im.begin(), fwjob.BeginBody{Job: "j1", Image: im.sum(), Size: 250, Version: 3, Chunk: 100, Manifest: []byte{0xd2, 0x84}}, im.chunkAt(0), im.chunkAt(100), im.job1(), fwjob.JobBody{Job: "j2"},
		map[string]any{"job": "j1", "off": 0}, map[string]any{"job": 7}, map[string]any{},
		map[string]any{"job": "j1", "image": make([]byte, 31), "size": 1, "version": 0, "chunk": 1},
		map[string]any{"job": "j1", "off": uint64(1) << 63, "data": []byte{1}}, []byte{1, 2}, nil,
	}
	for _, s := range seeds {
		b, err := fence.EncodeBody(s)
		if err != nil {
			f.Fatal(err)
		}
		for k := range fwjob.Kinds {
			f.Add(uint8(k), []byte(b))
		}
	}
	f.Add(uint8(0), []byte{0xbf, 0xff})
	f.Add(uint8(1), []byte{0xa1, 0x63, 'j', 'o', 'b', 0xff})
	r := newRig(f, fwjob.BootConfig{})
	r.must(fwjob.KindBegin, im.begin())
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := fwjob.Kinds[int(k)%len(fwjob.Kinds)]
		r.t = t
		r.token++
		env := &fence.Envelope{V: fence.Version, Device: dev, Token: r.token, Seq: 1, ID: "f", Kind: kind, Body: cbor.RawMessage(body)}
		raw, err := fence.MarshalEnvelope(env)
		if err != nil {
			return // not a body an envelope can carry: the envelope codec's fuzz covers it
		}
		before, mark := r.status(), r.mark()
		o := r.d.Handle(r.s, raw)
		after := r.status()
		switch o.Ack.Verdict {
		case fence.Accepted:
			if r.mark() != (fence.Mark{Token: r.token, Seq: 1}) || !slices.Contains(fwjob.States, after.State) || after.Bytes > after.Size {
				t.Fatalf("%s accepted: mark %v, %+v", kind, r.mark(), after)
			}
		case fence.Invalid:
			if fmt.Sprint(after) != fmt.Sprint(before) || r.mark() != mark || o.Ack.Reason == "" {
				t.Fatalf("%s refused (%q) but moved: %+v → %+v", kind, o.Ack.Reason, before, after)
			}
		default:
			t.Fatalf("%s: verdict %v", kind, o.Ack.Verdict)
		}
	})
}
