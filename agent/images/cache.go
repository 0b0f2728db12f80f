package images

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxImage     = 256 << 20
	DefaultMaxBytes     = 2 << 30
	DefaultFetchTimeout = 30 * time.Minute
)

// Options configure a Cache; the zero value means the defaults.
type Options struct {
	// MaxImage bounds one image (DefaultMaxImage).
	MaxImage uint64
	// MaxBytes bounds the entries' total (DefaultMaxBytes); at least
	// MaxImage.
	MaxBytes uint64
	// HTTP fetches http(s) URLs; its Transport carries the TLS
	// configuration (nil: a client with Go's default transport).
	HTTP *http.Client
	// FetchTimeout bounds one fetch (DefaultFetchTimeout).
	FetchTimeout time.Duration
	// Logger gets one line per failure and per entry removed (nil: none).
	Logger *slog.Logger
}

// Cache is the content-addressed image cache in one directory. Its
// methods are safe for concurrent use; one Cache per directory.
type Cache struct {
	dir string
	o   Options
	log *slog.Logger

	mu    sync.Mutex
	ents  map[string]*entry // by hex SHA-256
	busy  map[string]*op    // a check or fetch of the entry in progress
	bytes uint64
	st    Stats
}

// entry is an image on disk.
type entry struct {
	size    uint64
	used    time.Time // last Get (the file's mtime)
	refs    int       // Images open
	checked bool      // hashed by this process
}

// op is a check or fetch of one image that concurrent Gets share.
type op struct {
	done      chan struct{}
	err       error
	fetched   bool // it fetched the image (the Gets that waited missed)
	joined    int  // Gets that waited for it
	abandoned bool // its caller gave up: a waiter takes over
}

// Open opens (creating it if needed) the cache in dir: removes what a
// crash left of fetches and, if the entries exceed MaxBytes, the least
// recently used ones.
func Open(dir string, o Options) (*Cache, error) {
	if o.MaxImage == 0 {
		o.MaxImage = DefaultMaxImage
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxBytes < o.MaxImage {
		return nil, fmt.Errorf("images: MaxBytes %d below MaxImage %d", o.MaxBytes, o.MaxImage)
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{}
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cache{dir: dir, o: o, log: log, ents: map[string]*entry{}, busy: map[string]*op{}, st: Stats{Failures: map[string]uint64{}}}
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o755); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if err := c.scan(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.prune("")
	c.mu.Unlock()
	return c, nil
}

// scan removes temporary files and reads the entries on disk.
func (c *Cache) scan() error {
	tmps, err := filepath.Glob(filepath.Join(c.dir, tempPrefix+"*"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	for _, t := range tmps {
		c.log.Info("image cache: removing an unfinished fetch", "file", t)
		if err := os.Remove(t); err != nil {
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
	}
	des, err := os.ReadDir(filepath.Join(c.dir, "sha256"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	for _, de := range des {
		info, err := de.Info()
		if err != nil || !info.Mode().IsRegular() || !validKey(de.Name()) {
			c.log.Warn("image cache: ignoring a file that is not an entry", "file", filepath.Join(c.dir, "sha256", de.Name()))
			continue
		}
		if info.Size() == 0 {
			c.dropLocked(de.Name(), "empty entry")
			continue
		}
		c.ents[de.Name()] = &entry{size: uint64(info.Size()), used: info.ModTime()}
		c.bytes += uint64(info.Size())
	}
	return nil
}

func validKey(name string) bool {
	b, err := hex.DecodeString(name)
	return err == nil && len(b) == 32 && strings.ToLower(name) == name
}

func (c *Cache) path(key string) string { return filepath.Join(c.dir, "sha256", key) }

// Get returns the image ref names, fetching it first if the cache does
// not have it. The caller must Close it. Errors: see the package's
// sentinels; ctx ends the wait (and the fetch if this Get runs it).
func (c *Cache) Get(ctx context.Context, ref Ref) (*Image, error) {
	u, err := ref.check(c.o.MaxImage)
	if err != nil {
		c.mu.Lock()
		c.failLocked(ref, err)
		c.mu.Unlock()
		return nil, err
	}
	key := ref.Hex()
	missed := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.mu.Lock()
		if o := c.busy[key]; o != nil {
			o.joined++
			c.mu.Unlock()
			select {
			case <-o.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			missed = missed || o.fetched
			if o.err != nil && !o.abandoned {
				return nil, o.err
			}
			continue
		}
		if e := c.ents[key]; e != nil && e.checked {
			im, err, again := c.openLocked(key, e, ref, missed)
			c.mu.Unlock()
			if again {
				continue
			}
			return im, err
		}
		o := &op{done: make(chan struct{})}
		c.busy[key] = o
		onDisk := c.ents[key] != nil
		c.mu.Unlock()
		c.run(ctx, o, ref, u, key, onDisk)
		missed = missed || o.fetched
		if o.err != nil {
			return nil, o.err
		}
	}
}

// run checks the entry on disk (if any) and fetches the image if it has
// none or a corrupted one; o's waiters are released when it returns.
func (c *Cache) run(ctx context.Context, o *op, ref Ref, u *url.URL, key string, onDisk bool) {
	defer func() {
		c.mu.Lock()
		delete(c.busy, key)
		c.mu.Unlock()
		close(o.done)
	}()
	if onDisk {
		ok, err := c.check(key)
		if err != nil || ok {
			o.err = err
			return
		}
	}
	o.fetched = true
	o.err = c.fetch(ctx, ref, u, key)
	o.abandoned = o.err != nil && ctx.Err() != nil
}

// check hashes the entry key: true if it is what its name says (it is
// marked checked); false if not (it is removed and counted corrupt).
func (c *Cache) check(key string) (bool, error) {
	sum, n, err := HashFile(c.path(key))
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.ents[key]
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.forgetLocked(key)
		return false, nil
	case err != nil:
		err = fmt.Errorf("%w: check %s: %w", ErrStorage, key, err)
		c.st.Failures[reason(err)]++
		c.log.Warn("image cache: cannot check an entry", "sha256", key, "err", err)
		return false, err
	case e == nil:
		return false, nil
	case hex.EncodeToString(sum) != key || n != e.size:
		c.dropLocked(key, fmt.Sprintf("content has SHA-256 %x, %d bytes", sum, n))
		return false, nil
	}
	e.checked = true
	return true, nil
}

// fetch fetches ref into the entry key.
func (c *Cache) fetch(ctx context.Context, ref Ref, u *url.URL, key string) error {
	c.mu.Lock()
	c.st.Fetches++
	c.mu.Unlock()
	fctx, cancel := context.WithTimeout(ctx, c.o.FetchTimeout)
	defer cancel()
	st, err := c.fetchStaged(fctx, ref, u)
	switch {
	case err != nil && ctx.Err() != nil:
		err = ctx.Err()
	case err != nil && fctx.Err() != nil:
		err = fmt.Errorf("%w: not done within %s (%v)", ErrFetch, c.o.FetchTimeout, err) // not the caller's deadline: not "canceled"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		err = c.installLocked(st, key)
	}
	if err != nil {
		c.failLocked(ref, err)
		return err
	}
	c.st.FetchedBytes += st.size
	return nil
}

// fetchStaged streams the source into a temporary file and checks it.
func (c *Cache) fetchStaged(ctx context.Context, ref Ref, u *url.URL) (staged, error) {
	src, declared, err := c.source(ctx, u)
	if err != nil {
		return staged{}, err
	}
	defer src.Close()
	if declared >= 0 && uint64(declared) != ref.Size {
		return staged{}, fmt.Errorf("%w: source is %d bytes, want %d", ErrSizeMismatch, declared, ref.Size)
	}
	st, err := c.stream(ctx, src, ref.Size)
	if err != nil {
		return st, err
	}
	if !bytes.Equal(st.sum, ref.SHA256) {
		os.Remove(st.tmp)
		return staged{}, fmt.Errorf("%w: got %x", ErrHashMismatch, st.sum)
	}
	return st, nil
}

// installLocked moves st under key and registers the entry (already
// there: the same bytes, replaced), then prunes.
func (c *Cache) installLocked(st staged, key string) error {
	if err := c.install(st, key); err != nil {
		return err
	}
	now := time.Now()
	if e := c.ents[key]; e != nil {
		c.bytes -= e.size
		e.size, e.used, e.checked = st.size, now, true
	} else {
		c.ents[key] = &entry{size: st.size, used: now, checked: true}
	}
	c.bytes += st.size
	c.prune(key)
	return nil
}

// openLocked opens the checked entry key as an Image for ref. again: the
// entry was gone or had changed size (dropped): look again.
func (c *Cache) openLocked(key string, e *entry, ref Ref, missed bool) (im *Image, err error, again bool) {
	if e.size != ref.Size {
		err := fmt.Errorf("%w: the cached image %s is %d bytes, the reference says %d", ErrSizeMismatch, key, e.size, ref.Size)
		c.failLocked(ref, err)
		return nil, err, false
	}
	f, err := os.Open(c.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		c.forgetLocked(key)
		return nil, nil, true
	}
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrStorage, err)
		c.failLocked(ref, err)
		return nil, err, false
	}
	if info, err := f.Stat(); err != nil || uint64(info.Size()) != e.size {
		f.Close()
		c.dropLocked(key, "size changed on disk")
		return nil, nil, true
	}
	now := time.Now()
	e.refs++
	e.used = now
	_ = os.Chtimes(c.path(key), now, now) // the use order across restarts; best effort
	if missed {
		c.st.Misses++
	} else {
		c.st.Hits++
	}
	return &Image{c: c, key: key, f: f, size: e.size, sum: slices.Clone(ref.SHA256)}, nil, false
}

// release is Image.Close's: one use of key fewer.
func (c *Cache) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[key]; e != nil && e.refs > 0 {
		e.refs--
	}
}

// prune removes the least recently used entries not in use, not busy and
// not keep while the total exceeds MaxBytes.
func (c *Cache) prune(keep string) {
	for c.bytes > c.o.MaxBytes {
		victim := ""
		for k, e := range c.ents {
			if k == keep || e.refs > 0 || c.busy[k] != nil {
				continue
			}
			if victim == "" || e.used.Before(c.ents[victim].used) {
				victim = k
			}
		}
		if victim == "" {
			c.log.Warn("image cache over its size: every other entry is in use", "bytes", c.bytes, "max_bytes", c.o.MaxBytes)
			return
		}
		if err := os.Remove(c.path(victim)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("image cache: cannot remove an entry", "sha256", victim, "err", err)
			return
		}
		c.log.Info("image cache: pruned the least recently used entry", "sha256", victim, "bytes", c.ents[victim].size)
		c.forgetLocked(victim)
		c.st.Pruned++
	}
}

// dropLocked removes a corrupted entry and counts it.
func (c *Cache) dropLocked(key, why string) {
	c.log.Warn("image cache: removing a corrupted entry", "sha256", key, "why", why)
	if err := os.Remove(c.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("image cache: cannot remove an entry", "sha256", key, "err", err)
	}
	c.forgetLocked(key)
	c.st.Corrupt++
}

func (c *Cache) forgetLocked(key string) {
	if e := c.ents[key]; e != nil {
		c.bytes -= e.size
		delete(c.ents, key)
	}
}

// failLocked counts and logs a failure of ref.
func (c *Cache) failLocked(ref Ref, err error) {
	r := reason(err)
	c.st.Failures[r]++
	u := ref.URL
	if p, perr := url.Parse(ref.URL); perr == nil {
		u = p.Redacted()
	}
	c.log.Warn("image fetch failed", "url", u, "sha256", hex.EncodeToString(ref.SHA256), "reason", r, "err", err)
}

// Add puts the local file at path in the cache and returns its Ref (URL:
// the file's).
func (c *Cache) Add(ctx context.Context, path string) (Ref, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Ref{}, fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	f, err := os.Open(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return Ref{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return Ref{}, fmt.Errorf("%w: %w", ErrFetch, err)
	}
	defer f.Close()
	st, err := c.stream(ctx, io.Reader(f), 0)
	if err == nil && st.size == 0 {
		os.Remove(st.tmp)
		err = fmt.Errorf("%w: %s is empty", ErrSizeMismatch, abs)
	}
	ref := Ref{SHA256: st.sum, Size: st.size, URL: FileURL(abs)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		err = c.installLocked(st, hex.EncodeToString(st.sum))
	}
	if err != nil {
		c.failLocked(ref, err)
		return Ref{}, err
	}
	return ref, nil
}
