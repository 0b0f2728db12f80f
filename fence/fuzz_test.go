package fence_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

// maxSeed keeps the oversize table cases out of the seed corpus: they are
// rejected before decoding and would only slow the mutator down.
const maxSeed = 4 << 10

func FuzzUnmarshalEnvelope(f *testing.F) {
	for _, c := range validEnvelopeCases() {
		f.Add(c.in)
	}
	for _, c := range invalidEnvelopeCases() {
		if len(c.in) <= maxSeed {
			f.Add(c.in)
		}
	}
	full, err := fence.MarshalEnvelope(fullEnvelope(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full)

	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := fence.UnmarshalEnvelope(in)
		if err != nil {
			if e != nil {
				t.Fatalf("envelope %+v returned with error %v", e, err)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// Whatever decodes is valid, re-encodes, and re-encodes stably.
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded envelope fails Validate: %v", err)
		}
		b1, err := fence.MarshalEnvelope(e)
		if err != nil {
			t.Fatalf("decoded %+v but cannot re-encode it: %v", e, err)
		}
		e2, err := fence.UnmarshalEnvelope(b1)
		if err != nil {
			t.Fatalf("re-encoding %x does not decode: %v", b1, err)
		}
		if !equalEnvelope(e, e2) {
			t.Fatalf("re-encoding changed the envelope:\n%+v\n%+v", e, e2)
		}
		b2, err := fence.MarshalEnvelope(e2)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("re-encoding not stable:\n%x\n%x (%v)", b1, b2, err)
		}
		// A fence point can always answer a valid envelope.
		v, m := fence.Admit(fence.Mark{Token: 5, Seq: 5}, e.Token, e.Seq)
		ack := fence.NewAck(e, v, m, "fuzz")
		if _, err := fence.MarshalAck(&ack); err != nil {
			t.Fatalf("cannot encode the ack for %+v: %v", e, err)
		}
	})
}

func FuzzUnmarshalAck(f *testing.F) {
	for _, in := range validAckCases() {
		f.Add(in)
	}
	for _, c := range invalidAckCases() {
		if len(c.in) <= maxSeed {
			f.Add(c.in)
		}
	}
	full, err := fence.MarshalAck(fullAck())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full)

	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := fence.UnmarshalAck(in)
		if err != nil {
			if a != nil {
				t.Fatalf("ack %+v returned with error %v", a, err)
			}
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("decoded ack fails Validate: %v", err)
		}
		b1, err := fence.MarshalAck(a)
		if err != nil {
			t.Fatalf("decoded %+v but cannot re-encode it: %v", a, err)
		}
		a2, err := fence.UnmarshalAck(b1)
		if err != nil {
			t.Fatalf("re-encoding %x does not decode: %v", b1, err)
		}
		if *a != *a2 {
			t.Fatalf("re-encoding changed the ack:\n%+v\n%+v", a, a2)
		}
		b2, err := fence.MarshalAck(a2)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("re-encoding not stable:\n%x\n%x (%v)", b1, b2, err)
		}
		if err := a.Err(); (err == nil) != (a.Verdict == fence.Accepted) {
			t.Fatalf("verdict %v: Err() = %v", a.Verdict, err)
		}
	})
}

// FuzzDecodeBody: any input into a typed body is decoded or refused with
// ErrInvalid, and an unknown key is always reported (named when found).
func FuzzDecodeBody(f *testing.F) {
	for _, c := range unknownFieldCases() {
		b, err := fence.EncodeBody(c.in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(b))
	}
	f.Add([]byte{0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // a map claiming 2^64-1 pairs
	f.Fuzz(func(t *testing.T, in []byte) {
		var v strictBody
		err := fence.DecodeBody(in, &v)
		if err == nil {
			return
		}
		if !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("error %v does not wrap ErrInvalid", err)
		}
		if uf, ok := errors.AsType[*fence.UnknownFieldError](err); ok && uf.Error() == "" {
			t.Fatal("empty UnknownFieldError")
		}
	})
}
