package fence_test

import (
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func BenchmarkAdmit(b *testing.B) {
	for _, bc := range []struct {
		name string
		m    fence.Mark
		tok  fence.Token
		seq  uint64
	}{
		{"accept-next-seq", fence.Mark{Token: 1 << 20, Seq: 41}, 1 << 20, 42},
		{"accept-new-token", fence.Mark{Token: 1 << 20, Seq: 41}, 1<<20 + 7, 1},
		{"duplicate", fence.Mark{Token: 1 << 20, Seq: 41}, 1 << 20, 41},
		{"stale", fence.Mark{Token: 1 << 20, Seq: 41}, 1<<20 - 7, 99},
		{"invalid", fence.Mark{Token: 1 << 20, Seq: 41}, 0, 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fence.Admit(bc.m, bc.tok, bc.seq)
			}
		})
	}
	b.Run("stream", func(b *testing.B) {
		// One holder's commands in order, a redelivery every 8th, a new
		// holder every 1024.
		b.ReportAllocs()
		var m fence.Mark
		tok, seq := fence.Token(1), uint64(0)
		i := 0
		for b.Loop() {
			i++
			if i%1024 == 0 {
				tok, seq = tok+3, 0
			}
			if i%8 != 0 {
				seq++
			}
			_, m = fence.Admit(m, tok, seq)
		}
		if m.Token == 0 && b.N > 1 {
			b.Fatal("nothing accepted")
		}
	})
}

// BenchmarkAdmitEpoch is the admit rule with epochs (AdmitEpoch), for
// comparison with BenchmarkAdmit: the epoch compared first.
func BenchmarkAdmitEpoch(b *testing.B) {
	cur := fence.State{Epoch: 7, Mark: fence.Mark{Token: 1 << 20, Seq: 41}}
	for _, bc := range []struct {
		name  string
		e     uint64
		epoch uint64
		tok   fence.Token
		seq   uint64
	}{
		{"accept-next-seq", 0, 7, 1 << 20, 42},
		{"duplicate", 0, 7, 1 << 20, 41},
		{"epoch-closed", 0, 6, 1 << 30, 1},
		{"unknown-epoch", 0, 8, 1, 1},
		{"fleet-epoch-raised", 9, 9, 1, 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fence.AdmitEpoch(bc.e, cur, bc.epoch, bc.tok, bc.seq)
			}
		})
	}
}

// benchEnvelopes are a typical small command and two larger bodies.
func benchEnvelopes(b *testing.B) []struct {
	name string
	env  *fence.Envelope
} {
	small, err := fence.EncodeBody(map[string]any{"relay": true, "level": 42})
	if err != nil {
		b.Fatal(err)
	}
	blob, err := fence.EncodeBody(make([]byte, 4<<10))
	if err != nil {
		b.Fatal(err)
	}
	env := func(body []byte) *fence.Envelope {
		return &fence.Envelope{V: fence.Version, Device: "pump-07.site_a", Token: 1<<20 + 3, Seq: 12,
			ID: "01J9ZK3T8QW5R2M6X4N0B7C1DE", Kind: "set", Body: body, IssuedAt: 1700000000123, Holder: "gw-1.example"}
	}
	return []struct {
		name string
		env  *fence.Envelope
	}{
		{"body=small", env(small)},
		{"body=nested", env(fullEnvelope(b).Body)},
		{"body=4KiB", env(blob)},
	}
}

func BenchmarkMarshalEnvelope(b *testing.B) {
	for _, bc := range benchEnvelopes(b) {
		b.Run(bc.name, func(b *testing.B) {
			enc, err := fence.MarshalEnvelope(bc.env)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fence.MarshalEnvelope(bc.env); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/envelope")
		})
	}
}

func BenchmarkUnmarshalEnvelope(b *testing.B) {
	for _, bc := range benchEnvelopes(b) {
		b.Run(bc.name, func(b *testing.B) {
			enc, err := fence.MarshalEnvelope(bc.env)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fence.UnmarshalEnvelope(enc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/envelope")
		})
	}
}

func benchAck() *fence.Ack {
	return &fence.Ack{V: fence.Version, Device: "pump-07.site_a", ID: "01J9ZK3T8QW5R2M6X4N0B7C1DE", Verdict: fence.Stale,
		Token: 1 << 20, Seq: 12, MaxToken: 1<<20 + 3, LastSeq: 4, Reason: "newer holder at token 1048579"}
}

func BenchmarkMarshalAck(b *testing.B) {
	a := benchAck()
	enc, err := fence.MarshalAck(a)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fence.MarshalAck(a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(enc)), "bytes/ack")
}

func BenchmarkUnmarshalAck(b *testing.B) {
	enc, err := fence.MarshalAck(benchAck())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fence.UnmarshalAck(enc); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(enc)), "bytes/ack")
}
