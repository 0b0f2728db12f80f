package serial

import "errors"

// COBS (Consistent Overhead Byte Stuffing, Cheshire and Baker 1999) removes
// every 0x00 from a byte string at a cost of at most one byte in 254, so
// that 0x00 can delimit frames. The encoding is a sequence of blocks: a
// code byte n (1..255) followed by n-1 non-zero data bytes; a block with
// n < 255 stands for its data followed by a 0x00, except at the end of the
// string. This is the form of Wikipedia's examples: a final full block
// (code 0xFF) is not followed by an empty 0x01 block.

// errCOBS means an encoded string is not valid COBS: it contains a 0x00 or a
// block runs past its end.
var errCOBS = errors.New("serial: invalid COBS encoding")

// cobsMaxLen is the largest encoded length of n bytes.
func cobsMaxLen(n int) int { return n + n/254 + 1 }

// appendCOBS appends the COBS encoding of src to dst.
func appendCOBS(dst, src []byte) []byte {
	codeAt := len(dst)
	dst = append(dst, 0) // placeholder for the first code byte
	code := byte(1)
	for i, b := range src {
		if b != 0 {
			dst = append(dst, b)
			code++
			if code != 0xFF || i == len(src)-1 {
				continue
			}
		}
		// End the block: at a zero, or when it is full and more follows.
		dst[codeAt] = code
		codeAt = len(dst)
		dst = append(dst, 0)
		code = 1
	}
	dst[codeAt] = code
	return dst
}

// appendUncobs appends the decoding of the COBS string src to dst. It
// rejects any 0x00 in src and any block that runs past the end.
func appendUncobs(dst, src []byte) ([]byte, error) {
	for i := 0; i < len(src); {
		code := int(src[i])
		if code == 0 {
			return dst, errCOBS
		}
		i++
		end := i + code - 1
		if end > len(src) {
			return dst, errCOBS
		}
		for _, b := range src[i:end] {
			if b == 0 {
				return dst, errCOBS
			}
		}
		dst = append(dst, src[i:end]...)
		i = end
		if code != 0xFF && i < len(src) {
			dst = append(dst, 0)
		}
	}
	return dst, nil
}
