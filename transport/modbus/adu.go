package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The two application data units the field speaks around a PDU: Modbus
// RTU on a serial line (unit id, PDU, CRC-16; frames delimited by silence)
// and Modbus TCP (MBAP header: transaction id, protocol 0, length, unit
// id). References: Modbus over Serial Line v1.02 (2.5.1, 6.2.2, annex B);
// Modbus Messaging on TCP/IP v1.0b (3.1.3).

// Limits of unit ids and ADUs.
const (
	UnitBroadcast = 0   // RTU broadcast: no answer; never for a fenced write
	MaxUnit       = 247 // the highest unit id on a serial bus
	MaxRTUFrame   = 256 // unit (1) + PDU (253) + CRC (2)
	MBAPLen       = 7   // MBAP header bytes
	MaxTCPFrame   = MBAPLen + maxPDU
)

// Sentinel errors of the framing: a frame that fails them is dropped (and
// counted by its reader), never decoded.
var (
	// ErrCRC means an RTU frame's CRC-16 does not match its bytes (a bit
	// error on the line).
	ErrCRC = errors.New("modbus: RTU CRC mismatch")
	// ErrFrame means an ADU is malformed: too short or long, a bad MBAP
	// header, or another unit's answer.
	ErrFrame = errors.New("modbus: malformed frame")
)

// CRC16 is Modbus's CRC-16 (polynomial 0xA001 reflected, initial value
// 0xFFFF) of b; on the wire it follows the frame low byte first.
func CRC16(b []byte) uint16 {
	crc := uint16(0xFFFF)
	for _, c := range b {
		crc ^= uint16(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xA001
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

// EncodeRTU returns the RTU frame of pdu for unit: unit id, PDU, CRC-16.
func EncodeRTU(unit byte, pdu []byte) ([]byte, error) {
	if unit > MaxUnit || len(pdu) == 0 || len(pdu) > maxPDU {
		return nil, fmt.Errorf("%w: unit %d, PDU of %d bytes (want unit 0..%d, PDU 1..%d bytes)", ErrFrame, unit, len(pdu), MaxUnit, maxPDU)
	}
	f := make([]byte, 0, len(pdu)+3)
	f = append(f, unit)
	f = append(f, pdu...)
	return binary.LittleEndian.AppendUint16(f, CRC16(f)), nil
}

// DecodeRTU checks an RTU frame — length, CRC-16, and that it comes from
// unit (the answer of another unit is not ours) — and returns its PDU,
// which aliases frame.
func DecodeRTU(frame []byte, unit byte) ([]byte, error) {
	if len(frame) < 4 || len(frame) > MaxRTUFrame {
		return nil, fmt.Errorf("%w: RTU frame of %d bytes (want 4..%d)", ErrFrame, len(frame), MaxRTUFrame)
	}
	n := len(frame) - 2
	if got, want := binary.LittleEndian.Uint16(frame[n:]), CRC16(frame[:n]); got != want {
		return nil, fmt.Errorf("%w: frame says 0x%04x, bytes give 0x%04x", ErrCRC, got, want)
	}
	if frame[0] != unit {
		return nil, fmt.Errorf("%w: answer from unit %d, asked unit %d", ErrFrame, frame[0], unit)
	}
	return frame[1:n], nil
}

// RTUTiming is an RTU line's silent intervals at a baud rate: t1.5 (the
// longest gap allowed inside a frame) and t3.5 (the silence that ends
// one), and the time one character takes (11 bits: start, 8 data, parity
// or a second stop, stop).
type RTUTiming struct {
	Char, T15, T35 time.Duration
}

// TimingFor returns the RTU timing at baud; above 19,200 baud the
// standard fixes t1.5 at 750 µs and t3.5 at 1.75 ms.
func TimingFor(baud int) (RTUTiming, error) {
	if baud <= 0 {
		return RTUTiming{}, fmt.Errorf("%w: baud %d", ErrFrame, baud)
	}
	char := time.Duration(11 * int64(time.Second) / int64(baud))
	t := RTUTiming{Char: char, T15: char * 3 / 2, T35: char * 7 / 2}
	if baud > 19200 {
		t.T15, t.T35 = 750*time.Microsecond, 1750*time.Microsecond
	}
	return t, nil
}

// FrameTime is how long a frame of n bytes and the silence after it hold
// the line: the limit a bus's transactions per second are measured against.
func (t RTUTiming) FrameTime(n int) time.Duration { return time.Duration(n)*t.Char + t.T35 }

// MBAP is a Modbus TCP header.
type MBAP struct {
	Transaction uint16
	Unit        byte
}

// EncodeTCP returns the Modbus TCP ADU of pdu: the MBAP header (protocol
// 0, length = unit + PDU) and the PDU.
func EncodeTCP(h MBAP, pdu []byte) ([]byte, error) {
	if len(pdu) == 0 || len(pdu) > maxPDU {
		return nil, fmt.Errorf("%w: PDU of %d bytes (want 1..%d)", ErrFrame, len(pdu), maxPDU)
	}
	f := make([]byte, MBAPLen, MBAPLen+len(pdu))
	binary.BigEndian.PutUint16(f[0:], h.Transaction)
	binary.BigEndian.PutUint16(f[2:], 0)
	binary.BigEndian.PutUint16(f[4:], uint16(len(pdu)+1))
	f[6] = h.Unit
	return append(f, pdu...), nil
}

// DecodeMBAP checks a Modbus TCP header and returns it with the number of
// PDU bytes that follow it on the stream.
func DecodeMBAP(b []byte) (MBAP, int, error) {
	if len(b) < MBAPLen {
		return MBAP{}, 0, fmt.Errorf("%w: MBAP header of %d bytes", ErrFrame, len(b))
	}
	if p := binary.BigEndian.Uint16(b[2:]); p != 0 {
		return MBAP{}, 0, fmt.Errorf("%w: protocol id %d, want 0 (Modbus)", ErrFrame, p)
	}
	n := int(binary.BigEndian.Uint16(b[4:])) - 1
	if n < 1 || n > maxPDU {
		return MBAP{}, 0, fmt.Errorf("%w: MBAP length %d (want 2..%d)", ErrFrame, n+1, maxPDU+1)
	}
	return MBAP{Transaction: binary.BigEndian.Uint16(b[0:]), Unit: b[6]}, n, nil
}

// DecodeTCP checks a whole Modbus TCP ADU answering want (same
// transaction and unit) and returns its PDU, which aliases adu.
func DecodeTCP(adu []byte, want MBAP) ([]byte, error) {
	h, n, err := DecodeMBAP(adu)
	if err != nil {
		return nil, err
	}
	switch {
	case len(adu) != MBAPLen+n:
		return nil, fmt.Errorf("%w: %d PDU bytes, MBAP says %d", ErrFrame, len(adu)-MBAPLen, n)
	case h != want:
		return nil, fmt.Errorf("%w: answer %+v, asked %+v", ErrFrame, h, want)
	}
	return adu[MBAPLen:], nil
}
