package images_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/edgefence/edgefence/agent/images"
)

// BenchmarkFetch fetches a 32 MiB image into an empty cache: streamed,
// hashed, fsynced, renamed, directory fsynced (MB/s is the fetch rate).
func BenchmarkFetch(b *testing.B) {
	bl := newBlob(32<<20, 50)
	s := newServer(b, bl, false)
	for _, src := range []struct{ name, url string }{{"file", bl.file(b)}, {"http", s.url()}} {
		b.Run(src.name, func(b *testing.B) {
			b.SetBytes(int64(len(bl.data)))
			hc := client(b, nil)
			root := b.TempDir()
			for i := 0; b.Loop(); i++ {
				dir := filepath.Join(root, strconv.Itoa(i))
				c, err := images.Open(dir, images.Options{HTTP: hc})
				if err != nil {
					b.Fatal(err)
				}
				im, err := c.Get(context.Background(), bl.ref(src.url))
				if err != nil {
					b.Fatal(err)
				}
				im.Close()
				b.StopTimer()
				os.RemoveAll(dir)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkChunk reads 16 KiB chunks of a cached 32 MiB image in order,
// as the job runner does.
func BenchmarkChunk(b *testing.B) {
	const chunk = 16 << 10
	bl := newBlob(32<<20, 51)
	c, _, _ := open(b, "", images.Options{})
	im := mustGet(b, c, bl, bl.ref(bl.file(b)))
	defer im.Close()
	b.SetBytes(chunk)
	off := uint64(0)
	for b.Loop() {
		ch, err := im.Chunk(off, chunk)
		if err != nil {
			b.Fatal(err)
		}
		off += uint64(len(ch))
		if off == im.Size() {
			off = 0
		}
	}
}
