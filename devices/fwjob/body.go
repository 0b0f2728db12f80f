package fwjob

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// Command kinds of a firmware job, one fenced command per step.
const (
	KindBegin    = "fw.begin"
	KindChunk    = "fw.chunk"
	KindInstall  = "fw.install"
	KindActivate = "fw.activate"
	KindCommit   = "fw.commit"
	KindCancel   = "fw.cancel"
)

// Kinds are the firmware steps, in the order a job takes them (fw.cancel
// last: any time).
var Kinds = []string{KindBegin, KindChunk, KindInstall, KindActivate, KindCommit, KindCancel}

// IsKind reports whether kind is a firmware step (for a device that serves
// other commands too and hands these to a Device).
func IsKind(kind string) bool { return strings.HasPrefix(kind, "fw.") }

// Limits of the bodies.
const (
	// MaxJobLen bounds a job id (bytes of UTF-8, no control characters).
	MaxJobLen = 64
	// MaxChunk bounds the data of one fw.chunk: with its other fields the
	// body stays under fence.MaxBodySize.
	MaxChunk = fence.MaxBodySize - 2<<10
	// DefaultMaxImage is Config.MaxImage's default.
	DefaultMaxImage = 256 << 20
)

// BeginBody is the body of fw.begin: a new job for an image of Size bytes
// whose SHA-256 is Image, of security Version, sent in chunks of at most
// Chunk bytes. Manifest, optional, is the operator's signed manifest of the
// image (auth.Root.Manifest); a device with Config.Manifests requires it.
type BeginBody struct {
	Job      string `cbor:"job"`
	Image    []byte `cbor:"image"` // 32 bytes
	Size     uint64 `cbor:"size"`
	Version  uint64 `cbor:"version"`
	Chunk    uint64 `cbor:"chunk"`
	Manifest []byte `cbor:"manifest,omitempty"` // at most auth.MaxManifestSize
}

// ChunkBody is the body of fw.chunk: Data goes at byte Off of the image,
// which must be the bytes the device has received.
type ChunkBody struct {
	Job  string `cbor:"job"`
	Off  uint64 `cbor:"off"`
	Data []byte `cbor:"data"`
}

// JobBody is the body of fw.install, fw.activate, fw.commit and fw.cancel.
type JobBody struct {
	Job string `cbor:"job"`
}

// Encode encodes b as an envelope body.
func (b BeginBody) Encode() (cbor.RawMessage, error) { return fence.EncodeBody(b) }

// Encode encodes b as an envelope body.
func (b ChunkBody) Encode() (cbor.RawMessage, error) { return fence.EncodeBody(b) }

// Encode encodes b as an envelope body.
func (b JobBody) Encode() (cbor.RawMessage, error) { return fence.EncodeBody(b) }

// step is one decoded firmware command.
type step struct {
	kind     string
	job      string
	image    []byte // begin
	size     uint64 // begin
	version  uint64 // begin
	chunk    uint64 // begin
	manifest []byte // begin, optional
	off      uint64 // chunk
	data     []byte // chunk
}

// The wire bodies with every field a pointer, so that a missing field is
// told from a zero one.
type beginWire struct {
	Job      *string `cbor:"job"`
	Image    []byte  `cbor:"image"`
	Size     *uint64 `cbor:"size"`
	Version  *uint64 `cbor:"version"`
	Chunk    *uint64 `cbor:"chunk"`
	Manifest []byte  `cbor:"manifest"`
}

type chunkWire struct {
	Job  *string `cbor:"job"`
	Off  *uint64 `cbor:"off"`
	Data []byte  `cbor:"data"`
}

type jobWire struct {
	Job *string `cbor:"job"`
}

// parseStep decodes and checks a firmware command on its own (no state):
// the kind, every field present, within bounds. maxImage bounds the size.
func parseStep(env *fence.Envelope, maxImage uint64) (step, error) {
	s := step{kind: env.Kind}
	if len(env.Body) == 0 {
		return s, fmt.Errorf("%w: %s needs a body", ErrCommand, env.Kind)
	}
	var err error
	switch env.Kind {
	case KindBegin:
		err = parseBegin(env.Body, &s, maxImage)
	case KindChunk:
		err = parseChunk(env.Body, &s)
	case KindInstall, KindActivate, KindCommit, KindCancel:
		var w jobWire
		if err = decode(env.Kind, env.Body, &w); err == nil {
			s.job, err = jobID(w.Job)
		}
	default:
		return s, fmt.Errorf("%w: unknown kind %q (want one of %q)", ErrCommand, env.Kind, Kinds)
	}
	return s, err
}

func parseBegin(body cbor.RawMessage, s *step, maxImage uint64) error {
	var w beginWire
	if err := decode(KindBegin, body, &w); err != nil {
		return err
	}
	var err error
	if s.job, err = jobID(w.Job); err != nil {
		return err
	}
	switch {
	case len(w.Image) != sha256.Size:
		return fmt.Errorf("%w: fw.begin: image must be a %d-byte SHA-256, got %d bytes", ErrCommand, sha256.Size, len(w.Image))
	case w.Size == nil || w.Version == nil || w.Chunk == nil:
		return fmt.Errorf("%w: fw.begin needs size, version and chunk", ErrCommand)
	case *w.Size == 0 || *w.Size > maxImage:
		return fmt.Errorf("%w: fw.begin: size %d outside 1..%d", ErrCommand, *w.Size, maxImage)
	case *w.Chunk == 0 || *w.Chunk > MaxChunk:
		return fmt.Errorf("%w: fw.begin: chunk %d outside 1..%d", ErrCommand, *w.Chunk, MaxChunk)
	case len(w.Manifest) > auth.MaxManifestSize:
		return fmt.Errorf("%w: fw.begin: manifest of %d bytes, limit %d", ErrCommand, len(w.Manifest), auth.MaxManifestSize)
	}
	s.image, s.size, s.version, s.chunk, s.manifest = w.Image, *w.Size, *w.Version, *w.Chunk, w.Manifest
	return nil
}

func parseChunk(body cbor.RawMessage, s *step) error {
	var w chunkWire
	if err := decode(KindChunk, body, &w); err != nil {
		return err
	}
	var err error
	if s.job, err = jobID(w.Job); err != nil {
		return err
	}
	switch {
	case w.Off == nil:
		return fmt.Errorf("%w: fw.chunk needs off", ErrCommand)
	case len(w.Data) == 0 || len(w.Data) > MaxChunk:
		return fmt.Errorf("%w: fw.chunk: data of %d bytes outside 1..%d", ErrCommand, len(w.Data), MaxChunk)
	}
	s.off, s.data = *w.Off, w.Data
	return nil
}

// decode decodes a body strictly (fence.DecodeBody: limits, unknown fields
// named).
func decode(kind string, body cbor.RawMessage, v any) error {
	if err := fence.DecodeBody(body, v); err != nil {
		if uf, ok := errors.AsType[*fence.UnknownFieldError](err); ok {
			return fmt.Errorf("%w: %s: %w", ErrCommand, kind, uf)
		}
		return fmt.Errorf("%w: %s body: %w", ErrCommand, kind, err)
	}
	return nil
}

// jobID checks a job id: present, 1..MaxJobLen bytes of UTF-8 without
// control characters.
func jobID(p *string) (string, error) {
	if p == nil {
		return "", fmt.Errorf("%w: job missing", ErrCommand)
	}
	j := *p
	if j == "" || len(j) > MaxJobLen || !utf8.ValidString(j) || strings.ContainsFunc(j, unicode.IsControl) {
		return "", fmt.Errorf("%w: job id must be 1 to %d bytes of text without control characters", ErrCommand, MaxJobLen)
	}
	return j, nil
}
