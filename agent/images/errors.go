package images

import "errors"

// Sentinel errors; callers test them with errors.Is.
var (
	// ErrHashMismatch: the bytes fetched do not have the Ref's SHA-256.
	ErrHashMismatch = errors.New("images: SHA-256 mismatch")
	// ErrSizeMismatch: the source is shorter or longer than the Ref's
	// size, or declares another length.
	ErrSizeMismatch = errors.New("images: size mismatch")
	// ErrTooLarge: the image is larger than Options.MaxImage.
	ErrTooLarge = errors.New("images: image too large")
	// ErrNotFound: the source does not exist (a missing file, HTTP 404/410).
	ErrNotFound = errors.New("images: image not found")
	// ErrFetch: the source could not be read (the cause is wrapped): a
	// connection refused or cut, a TLS failure, an HTTP status other than
	// 200, 404 and 410, a fetch over Options.FetchTimeout.
	ErrFetch = errors.New("images: fetch failed")
	// ErrBadURL: a Ref whose URL is not file:///abs/path or http(s)://host/…,
	// or whose hash or size is malformed.
	ErrBadURL = errors.New("images: bad image reference")
	// ErrStorage: the cache's own directory could not be read or written.
	ErrStorage = errors.New("images: storage")
)
