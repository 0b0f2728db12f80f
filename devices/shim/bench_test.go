package shim_test

import (
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// BenchmarkHandle measures the accepted path: decode, check, admit, commit
// (with fsync unless deferred), apply.
func BenchmarkHandle(b *testing.B) {
	cases := []struct {
		name     string
		opts     shim.Options
		device   shim.Device
		perToken uint64 // commands per token: every perToken-th command changes the token
	}{
		{"fsync", shim.Options{}, &recorder{}, 1 << 62},
		{"fsync-txapplier", shim.Options{}, counter{}, 1 << 62},
		{"token-change-only/seq-advances", shim.Options{PersistOnTokenChangeOnly: true}, &recorder{}, 1 << 62},
		{"token-change-only/token-every-16", shim.Options{PersistOnTokenChangeOnly: true}, &recorder{}, 16},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := open(b, filepath.Join(b.TempDir(), "fence.db"), &c.opts)
			raws := make([][]byte, b.N)
			for i := range raws {
				raws[i] = envelope(b, "dev-b", fence.Token(1+uint64(i)/c.perToken), uint64(i)%c.perToken+1, "ok")
			}
			if r, ok := c.device.(*recorder); ok {
				r.applied = r.applied[:0]
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if ack := s.Handle("dev-b", raws[i], c.device); ack.Verdict != fence.Accepted {
					b.Fatalf("%+v", ack)
				}
			}
		})
	}
}

// BenchmarkHandleDuplicate measures the refusal path (no write).
func BenchmarkHandleDuplicate(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "fence.db"), nil)
	raw := envelope(b, "dev-b", 5, 1, "ok")
	s.Handle("dev-b", raw, &recorder{})
	b.ReportAllocs()
	for b.Loop() {
		if ack := s.Handle("dev-b", raw, &recorder{}); ack.Verdict != fence.Duplicate {
			b.Fatalf("%+v", ack)
		}
	}
}
