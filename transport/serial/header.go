package serial

import (
	"encoding/binary"
	"fmt"
)

// The link header opens the payload of every frame a Link or Responder
// sends (all integers big-endian):
//
//	offset  size  field
//	0       1     version (headerVersion = 1)
//	1       1     type: 1 request, 2 response
//	2       4     txid: transaction id, echoed by the response
//	6       n     body: the request or response bytes
//
// A retry resends the identical frame, txid included, so the device can tell
// a retry from a new command.
const (
	headerVersion = 1
	headerLen     = 6

	typeRequest  = 1
	typeResponse = 2
)

type header struct {
	typ  byte
	txid uint32
}

// appendMessage appends the frame payload for h and body.
func appendMessage(dst []byte, h header, body []byte) []byte {
	dst = append(dst, headerVersion, h.typ)
	dst = binary.BigEndian.AppendUint32(dst, h.txid)
	return append(dst, body...)
}

// parseMessage splits a frame payload into header and body.
func parseMessage(p []byte) (header, []byte, error) {
	if len(p) < headerLen {
		return header{}, nil, fmt.Errorf("serial: message of %d bytes, shorter than the %d-byte header", len(p), headerLen)
	}
	if p[0] != headerVersion {
		return header{}, nil, fmt.Errorf("serial: message version %d, want %d", p[0], headerVersion)
	}
	if p[1] != typeRequest && p[1] != typeResponse {
		return header{}, nil, fmt.Errorf("serial: message type %d unknown", p[1])
	}
	return header{typ: p[1], txid: binary.BigEndian.Uint32(p[2:6])}, p[headerLen:], nil
}

// encodeMessage returns the wire frame for h and body.
func encodeMessage(h header, body []byte) ([]byte, error) {
	return Encode(appendMessage(make([]byte, 0, headerLen+len(body)), h, body))
}
