package images

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
)

// Ref names an image: its SHA-256 (the cache key), its size and where to
// fetch it from.
type Ref struct {
	SHA256 []byte // 32 bytes
	Size   uint64
	URL    string // file:///abs/path, http://… or https://…
}

// Hex is the image's SHA-256 in hex, its name in the cache.
func (r Ref) Hex() string { return hex.EncodeToString(r.SHA256) }

// check validates r against the largest image and returns its parsed URL.
func (r Ref) check(maxImage uint64) (*url.URL, error) {
	if len(r.SHA256) != sha256.Size {
		return nil, fmt.Errorf("%w: SHA-256 of %d bytes, want %d", ErrBadURL, len(r.SHA256), sha256.Size)
	}
	if r.Size == 0 {
		return nil, fmt.Errorf("%w: size 0", ErrBadURL)
	}
	if r.Size > maxImage {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.Size, maxImage)
	}
	return parseURL(r.URL)
}

// parseURL accepts file:///abs/path (host empty or localhost) and
// http(s)://host/….
func parseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" || !filepath.IsAbs(u.Path) || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("%w: %q: want file:///absolute/path", ErrBadURL, u.Redacted())
		}
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("%w: %q: no host", ErrBadURL, u.Redacted())
		}
	default:
		return nil, fmt.Errorf("%w: %q: scheme %q, want file, http or https", ErrBadURL, u.Redacted(), u.Scheme)
	}
	return u, nil
}

// FileURL returns the file URL of an absolute path.
func FileURL(path string) string {
	return (&url.URL{Scheme: "file", Path: path}).String()
}
