package serial

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"testing"
	"testing/iotest"

	"pgregory.net/rapid"
)

// fataler is what the helpers need of a *testing.T or *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustEncode(t fataler, payload []byte) []byte {
	t.Helper()
	f, err := Encode(payload)
	if err != nil {
		t.Fatalf("Encode(%d bytes): %v", len(payload), err)
	}
	return f
}

// body returns a frame's COBS part: the wire form without its delimiters.
func body(f []byte) []byte { return f[1 : len(f)-1] }

func filled(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

func TestEncodeLayout(t *testing.T) {
	payload := []byte{0x11, 0x00, 0x22}
	crc := binary.BigEndian.AppendUint32(nil, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	want := cat([]byte{0x00}, appendCOBS(nil, cat(payload, crc)), []byte{0x00})
	if got := mustEncode(t, payload); !bytes.Equal(got, want) {
		t.Fatalf("Encode = %x, want %x", got, want)
	}
	// The CRC-32C check value: CRC of "123456789" is 0xE3069283.
	if got := crc32.Checksum([]byte("123456789"), castagnoli); got != 0xE3069283 {
		t.Fatalf("CRC-32C check value %#x", got)
	}
}

func TestEncodeSizeLimits(t *testing.T) {
	for _, n := range []int{0, MaxPayloadLimit + 1} {
		if _, err := Encode(make([]byte, n)); !errors.Is(err, ErrFrameSize) {
			t.Errorf("Encode(%d bytes) error = %v, want ErrFrameSize", n, err)
		}
	}
	for _, n := range []int{1, MaxPayloadLimit} {
		f := mustEncode(t, make([]byte, n))
		if len(f) > encodedLen(n) {
			t.Errorf("Encode(%d bytes) is %d bytes, above encodedLen %d", n, len(f), encodedLen(n))
		}
	}
}

// timeoutReader returns ErrReadTimeout before every chunk, as a Port does
// when bytes trickle in, to check that a Decoder keeps a partial frame
// across timeouts.
type timeoutReader struct {
	r    io.Reader
	tick bool
}

func (r *timeoutReader) Read(p []byte) (int, error) {
	r.tick = !r.tick
	if r.tick {
		return 0, ErrReadTimeout
	}
	return r.r.Read(p)
}

// decodeAll runs a Decoder until EOF, skipping timeouts.
func decodeAll(t fataler, d *Decoder) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		p, err := d.Next()
		switch {
		case err == nil:
			out = append(out, p)
		case errors.Is(err, ErrReadTimeout):
		case err == io.EOF:
			return out
		default:
			t.Fatalf("Next: %v", err)
		}
	}
}

// decoderCases are streams with the frames a Decoder must deliver from
// them. They also seed FuzzDecoder.
func decoderCases(t testing.TB) []struct {
	name   string
	stream []byte
	want   [][]byte
	stats  FrameStats // fields checked when non-zero
} {
	a, b := []byte("alpha"), []byte{0x00, 0x01, 0x00, 0xFF}
	fa, fb := mustEncode(t, a), mustEncode(t, b)
	max := mustEncode(t, filled(64, 0x5A))
	over := mustEncode(t, filled(65, 0x5A))
	flipped := slices.Clone(fa)
	flipped[3] ^= 0x04
	return []struct {
		name   string
		stream []byte
		want   [][]byte
		stats  FrameStats
	}{
		{"one frame", fa, [][]byte{a}, FrameStats{FramesOK: 1}},
		{"two frames", cat(fa, fb), [][]byte{a, b}, FrameStats{FramesOK: 2}},
		{"idle delimiters", cat(filled(5, 0), fa, filled(3, 0), fb), [][]byte{a, b}, FrameStats{FramesOK: 2}},
		{"no leading delimiter", cat(body(fa), []byte{0}, fb), [][]byte{a, b}, FrameStats{FramesOK: 2}},
		{"garbage before", cat([]byte("line noise"), fa), [][]byte{a}, FrameStats{FramesOK: 1, GarbageBytes: 10}},
		{"garbage with zeros", cat([]byte{1, 2, 0, 3, 0, 0, 9}, fa, []byte{7, 0, 7}, fb), [][]byte{a, b}, FrameStats{FramesOK: 2}},
		{"truncated", cat(fa[:len(fa)/2], fb), [][]byte{b}, FrameStats{FramesOK: 1}},
		{"truncated at end", cat(fa, fb[:len(fb)-1]), [][]byte{a}, FrameStats{FramesOK: 1}},
		{"bit flip", cat(flipped, fb), [][]byte{b}, FrameStats{FramesOK: 1}},
		{"max size", cat(max, fa), [][]byte{filled(64, 0x5A), a}, FrameStats{FramesOK: 2}},
		{"oversize", cat(over, fa), [][]byte{a}, FrameStats{FramesOK: 1, Oversize: 1}},
		{"long noise without delimiter", cat(filled(500, 0x7F), fa), [][]byte{a}, FrameStats{FramesOK: 1, Oversize: 1, GarbageBytes: 500}},
		{"empty payload", cat([]byte{0, 1, 1, 1, 1, 1, 0}, fa), [][]byte{a}, FrameStats{FramesOK: 1, Malformed: 1}},
		{"bad CRC", cat([]byte{0}, appendCOBS(nil, cat(a, []byte{1, 2, 3, 4})), []byte{0}, fb), [][]byte{b}, FrameStats{FramesOK: 1, CRCErrors: 1}},
		{"invalid COBS", cat([]byte{0, 9, 1, 2, 0}, fa), [][]byte{a}, FrameStats{FramesOK: 1, Malformed: 1, GarbageBytes: 3}},
	}
}

func TestDecoder(t *testing.T) {
	readers := map[string]func([]byte) io.Reader{
		"whole":    func(b []byte) io.Reader { return bytes.NewReader(b) },
		"one byte": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"timeouts": func(b []byte) io.Reader {
			return &timeoutReader{r: iotest.HalfReader(bytes.NewReader(b))}
		},
		"data with EOF": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for _, tc := range decoderCases(t) {
		for rname, newReader := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				d, err := NewDecoder(newReader(tc.stream), 64)
				if err != nil {
					t.Fatal(err)
				}
				got := decodeAll(t, d)
				if !slices.EqualFunc(got, tc.want, bytes.Equal) {
					t.Fatalf("frames = %x, want %x", got, tc.want)
				}
				s := d.Stats()
				check := func(name string, got, want uint64) {
					if want != 0 && got != want {
						t.Errorf("%s = %d, want %d (stats %+v)", name, got, want, s)
					}
				}
				check("FramesOK", s.FramesOK, tc.stats.FramesOK)
				check("CRCErrors", s.CRCErrors, tc.stats.CRCErrors)
				check("Oversize", s.Oversize, tc.stats.Oversize)
				check("Malformed", s.Malformed, tc.stats.Malformed)
				check("GarbageBytes", s.GarbageBytes, tc.stats.GarbageBytes)
			})
		}
	}
}

func TestNewDecoderLimits(t *testing.T) {
	for _, n := range []int{-1, MaxPayloadLimit + 1} {
		if _, err := NewDecoder(bytes.NewReader(nil), n); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewDecoder(max %d) error = %v, want ErrInvalidConfig", n, err)
		}
	}
}

// referenceDecode is the obvious decoder, for comparison: split at every
// delimiter, decode each complete piece on its own, keep what checks out.
func referenceDecode(stream []byte, maxPayload int) [][]byte {
	var out [][]byte
	pieces := bytes.Split(stream, []byte{0})
	for _, seg := range pieces[:len(pieces)-1] { // the last piece is unterminated
		if len(seg) == 0 || len(seg) > cobsMaxLen(maxPayload+crcLen) {
			continue
		}
		p, err := appendUncobs(nil, seg)
		if err != nil || len(p) <= crcLen || len(p)-crcLen > maxPayload {
			continue
		}
		n := len(p) - crcLen
		if binary.BigEndian.Uint32(p[n:]) == crc32.Checksum(p[:n], castagnoli) {
			out = append(out, p[:n])
		}
	}
	return out
}

// FuzzDecoder feeds arbitrary bytes to a Decoder: it must not panic, and
// must deliver exactly the frames whose CRC checks, as referenceDecode
// finds them; so it never delivers a frame whose CRC fails.
func FuzzDecoder(f *testing.F) {
	for _, tc := range decoderCases(f) {
		f.Add(tc.stream)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		const maxPayload = 64
		d, err := NewDecoder(iotest.HalfReader(bytes.NewReader(stream)), maxPayload)
		if err != nil {
			t.Fatal(err)
		}
		got := decodeAll(t, d)
		want := referenceDecode(stream, maxPayload)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("Decoder delivered %x, reference %x", got, want)
		}
		if s := d.Stats(); s.FramesOK != uint64(len(got)) {
			t.Fatalf("FramesOK = %d, delivered %d", s.FramesOK, len(got))
		}
	})
}

// TestDecoderProperty: any sequence of valid frames interleaved with noise
// (with and without delimiters), some frames damaged (bit flips, noise
// inside, truncation) or over the limit, read in arbitrary chunks with
// timeouts between them, yields exactly the valid frames that were not
// damaged, in order.
func TestDecoderProperty(t *testing.T) {
	const maxPayload = 64
	rapid.Check(t, func(rt *rapid.T) {
		var stream []byte
		var want [][]byte
		items := rapid.IntRange(0, 12).Draw(rt, "items")
		for i := range items {
			label := func(s string) string { return fmt.Sprintf("%s%d", s, i) }
			switch kind := rapid.IntRange(0, 6).Draw(rt, label("kind")); kind {
			case 0: // noise without delimiters
				stream = append(stream, rapid.SliceOfN(rapid.ByteRange(1, 255), 1, 80).Draw(rt, label("noise"))...)
			case 1: // noise with delimiters
				stream = append(stream, rapid.SliceOfN(rapid.Byte(), 1, 80).Draw(rt, label("noise"))...)
			case 2: // oversize frame
				p := rapid.SliceOfN(rapid.Byte(), maxPayload+1, maxPayload+300).Draw(rt, label("big"))
				stream = append(stream, mustEncode(rt, p)...)
			default:
				p := rapid.SliceOfN(rapid.Byte(), 1, maxPayload).Draw(rt, label("payload"))
				f := mustEncode(rt, p)
				b := body(f) // damage only between the delimiters
				switch kind {
				case 3: // intact
					want = append(want, p)
				case 4: // bit flip
					at := rapid.IntRange(0, len(b)*8-1).Draw(rt, label("bit"))
					b[at/8] ^= 1 << (at % 8)
				case 5: // noise inside (no delimiter, else a piece could survive)
					at := rapid.IntRange(0, len(b)).Draw(rt, label("at"))
					noise := rapid.SliceOfN(rapid.ByteRange(1, 255), 1, 20).Draw(rt, label("noise"))
					f = cat(f[:1+at], noise, f[1+at:])
				case 6: // truncated: the rest, trailing delimiter included, is lost
					// The line then idles into a delimiter. Without one, noise
					// that follows could be the very bytes that were cut (one
					// byte in 256: CI drew it) and rebuild the intact frame.
					f = append(f[:1+rapid.IntRange(0, len(b)-1).Draw(rt, label("cut"))], 0)
				}
				stream = append(stream, f...)
			}
		}
		// Finish with a delimiter so that a truncated last frame ends.
		stream = append(stream, 0)

		chunks := rapid.SliceOfN(rapid.IntRange(1, 64), 1, 16).Draw(rt, "chunks")
		d, err := NewDecoder(&chunkReader{b: stream, sizes: chunks}, maxPayload)
		if err != nil {
			rt.Fatal(err)
		}
		got := decodeAll(rt, d)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			rt.Fatalf("frames = %x\nwant %x\nstream %x", got, want, stream)
		}
	})
}

// chunkReader returns b in chunks of the given sizes (cycling), with a
// timeout between chunks.
type chunkReader struct {
	b     []byte
	sizes []int
	i     int
	tick  bool
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	if r.tick = !r.tick; r.tick {
		return 0, ErrReadTimeout
	}
	n := min(r.sizes[r.i%len(r.sizes)], len(p), len(r.b))
	r.i++
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}
