package fwjob_test

import (
	"fmt"
	"testing"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// BenchmarkChunk measures the device's side of the transfer: one fw.chunk
// decided and applied — decode, admit, the slot write and its fsync, the
// record and the mark in one fsynced bbolt commit — by chunk size.
func BenchmarkChunk(b *testing.B) {
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10, fwjob.MaxChunk} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			r := newRig(b, fwjob.BootConfig{})
			r.cfg.MaxImage = uint64(b.N+1) * uint64(size)
			var err error
			if r.d, err = fwjob.New(r.cfg); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			r.must(fwjob.KindBegin, fwjob.BeginBody{Job: "bench", Image: make([]byte, 32), Size: r.cfg.MaxImage, Version: 1, Chunk: uint64(size)})
			raws := make([][]byte, b.N)
			for i := range raws {
				raws[i] = r.env(fwjob.KindChunk, fwjob.ChunkBody{Job: "bench", Off: uint64(i) * uint64(size), Data: data})
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				if o := r.d.Handle(r.s, raws[i]); o.Ack.Verdict != fence.Accepted {
					b.Fatalf("%+v", o.Ack)
				}
			}
		})
	}
}
