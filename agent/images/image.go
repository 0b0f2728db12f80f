package images

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
)

// Image is a cached image in use: the cache does not remove it until it is
// closed. Its reads are safe for concurrent use.
type Image struct {
	c    *Cache
	key  string
	f    *os.File
	size uint64
	sum  []byte
	once sync.Once
}

// Size is the image's size in bytes.
func (im *Image) Size() uint64 { return im.size }

// SHA256 is the image's SHA-256.
func (im *Image) SHA256() []byte { return slices.Clone(im.sum) }

// ReadAt implements io.ReaderAt.
func (im *Image) ReadAt(p []byte, off int64) (int, error) { return im.f.ReadAt(p, off) }

// Chunk returns the n bytes at off, fewer at the end of the image; io.EOF
// at or past the end.
func (im *Image) Chunk(off uint64, n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("images: chunk of %d bytes", n)
	}
	if off >= im.size {
		return nil, io.EOF
	}
	m := min(uint64(n), im.size-off)
	buf := make([]byte, m)
	got, err := im.f.ReadAt(buf, int64(off))
	if uint64(got) == m {
		return buf, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("%w: image %s at %d: %w", ErrStorage, im.key, off, err)
}

// Close releases the image (the cache may prune it then). Idempotent.
func (im *Image) Close() error {
	var err error
	im.once.Do(func() {
		err = im.f.Close()
		im.c.release(im.key)
	})
	return err
}
