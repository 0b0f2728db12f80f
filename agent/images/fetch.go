package images

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
)

// tempPrefix starts the name of a fetch's temporary file in the cache's
// directory; Open removes what a crash left of them.
const tempPrefix = ".fetch-"

// source opens the bytes u names and returns them with their declared
// length (-1: not declared).
func (c *Cache) source(ctx context.Context, u *url.URL) (io.ReadCloser, int64, error) {
	if u.Scheme == "file" {
		f, err := os.Open(u.Path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrFetch, err)
		}
		st, err := f.Stat()
		if err == nil && !st.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", u.Path)
		}
		if err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("%w: %w", ErrFetch, err)
		}
		return f, st.Size(), nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrFetch, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.Body, resp.ContentLength, nil
	case http.StatusNotFound, http.StatusGone:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("%w: HTTP %s", ErrNotFound, resp.Status)
	default:
		resp.Body.Close()
		return nil, 0, fmt.Errorf("%w: HTTP %s", ErrFetch, resp.Status)
	}
}

// staged is an image streamed into a temporary file, closed and fsynced.
type staged struct {
	tmp  string
	sum  []byte
	size uint64
}

// stream copies src into a new temporary file in the cache's directory,
// hashing it. size is the length the source must have (0: unknown, up to
// MaxImage); reading stops as soon as the source is longer. On error no
// temporary file is left.
func (c *Cache) stream(ctx context.Context, src io.Reader, size uint64) (st staged, err error) {
	f, err := os.CreateTemp(c.dir, tempPrefix+"*")
	if err != nil {
		return st, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	limit := size
	if limit == 0 {
		limit = c.o.MaxImage
	}
	n, err := copyLimited(ctx, f, h, src, limit)
	switch {
	case errors.Is(err, errLonger) && size != 0:
		return st, fmt.Errorf("%w: source longer than %d bytes (stopped at %d)", ErrSizeMismatch, size, n)
	case errors.Is(err, errLonger):
		return st, fmt.Errorf("%w: longer than %d bytes", ErrTooLarge, limit)
	case err != nil:
		return st, err
	}
	if size != 0 && n < size {
		return st, fmt.Errorf("%w: source ended after %d bytes, want %d", ErrSizeMismatch, n, size)
	}
	if err := f.Sync(); err != nil {
		return st, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if err := f.Close(); err != nil {
		return st, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return staged{tmp: f.Name(), sum: h.Sum(nil), size: n}, nil
}

// errLonger: the source has more than the bytes allowed.
var errLonger = errors.New("source too long")

// copyLimited copies src to f and h until EOF, at most limit bytes: a
// source that has byte limit+1 is refused as soon as it is read. ctx is
// checked between reads.
func copyLimited(ctx context.Context, f *os.File, h hash.Hash, src io.Reader, limit uint64) (uint64, error) {
	buf := make([]byte, 256<<10)
	var n uint64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		want := uint64(len(buf))
		if rest := limit + 1 - n; rest < want {
			want = rest
		}
		m, rerr := src.Read(buf[:want])
		if m > 0 {
			n += uint64(m)
			if n > limit {
				return n, errLonger
			}
			h.Write(buf[:m])
			if _, err := f.Write(buf[:m]); err != nil {
				return n, fmt.Errorf("%w: %w", ErrStorage, err)
			}
		}
		switch {
		case rerr == io.EOF:
			return n, nil
		case rerr != nil && ctx.Err() != nil:
			return n, ctx.Err()
		case rerr != nil:
			return n, fmt.Errorf("%w: after %d bytes: %w", ErrFetch, n, rerr)
		}
	}
}

// install moves a staged image under its name and fsyncs the directory.
func (c *Cache) install(st staged, key string) error {
	if err := os.Rename(st.tmp, c.path(key)); err != nil {
		os.Remove(st.tmp)
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if err := syncDir(filepath.Join(c.dir, "sha256")); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// HashFile returns the SHA-256 and size of the file at path (what a Ref
// for it names).
func HashFile(path string) ([]byte, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, 0, err
	}
	return h.Sum(nil), uint64(n), nil
}
