// Package serial is edgefence's serial transport for legacy devices that
// cannot check fencing tokens: the gateway they are wired to admits each
// command against its fence table and then sends it here. It provides
//
//   - framing for byte streams: Encode and a resynchronising Decoder;
//   - a Link, the gateway's side: request/response transactions with a
//     transaction id, a per-attempt timeout and retries that resend the
//     same id;
//   - a Responder (and Serve), the device's side: it applies each request
//     once and answers retries from memory, as a DF1 device does with its
//     TNS check; the device simulator uses it;
//   - a Port, one open tty through github.com/tarm/serial with its traps
//     handled, and a Conn, a port that survives its USB-serial adapter
//     being unplugged and plugged back.
//
// # Framing
//
// A frame on the wire is
//
//	0x00 | COBS( payload | CRC-32C(payload) ) | 0x00
//
// COBS (Consistent Overhead Byte Stuffing) removes every 0x00 from
// payload and CRC, so 0x00 only ever delimits frames. The CRC is CRC-32C
// (Castagnoli, hash/crc32), big-endian, over the payload. The leading
// delimiter ends whatever noise the receiver may have buffered while the
// line was idle, so that noise cannot spoil the next frame; consecutive
// delimiters are idle fill. Payloads hold 1 byte to 1 KiB by default
// (Decoder and Link take a limit up to 64 KiB).
//
// We chose COBS with CRC-32C over SLIP with CRC-16-CCITT. COBS costs at
// most one byte in 254 whatever the data, whereas SLIP doubles every
// 0xC0 and 0xDB, up to twice the length for unlucky binary register
// values, which matters at 115200 baud. A 16-bit CRC lets about one
// corrupt frame in 65536 through, too many for a noisy RS-485 line that
// carries commands all day. CRC-32C detects every burst up to 32 bits and,
// for frames up to about 650 bytes (all our commands), any five bit errors
// (Hamming distance 6, where the IEEE polynomial keeps it only to 33
// bytes); hash/crc32 computes it with the CPU's CRC32 instructions on
// amd64 and arm64. The COBS
// code is ours (60 lines, tested with the examples of the Wikipedia
// article, which also seed the fuzz targets): github.com/pdgendt/cobs is not
// served by our module proxy, and tailscale.com/util/cobs would bring the
// whole tailscale module into go.mod.
//
// A Decoder never delivers a frame whose CRC fails. Noise, truncated
// frames, bit errors and frames over the limit are dropped and counted
// (FrameStats: frames ok, CRC errors, oversize, malformed, garbage bytes)
// and decoding resumes after the next delimiter; a frame that grows past
// the limit is discarded as it arrives, so memory stays bounded. An empty
// payload is not a frame: its CRC-32C is 0, which would make the noise
// 01 01 01 01 01 valid.
//
// # Transactions
//
// The payload of every Link and Responder frame starts with a 6-byte header
// (integers big-endian):
//
//	offset  size  field
//	0       1     version, 1
//	1       1     type: 1 request, 2 response
//	2       4     txid, chosen by the Link; the response echoes it
//	6       n     body: the command or its answer
//
// A Link runs one transaction at a time (stop-and-wait): Do calls queue.
// When the response does not come within LinkConfig.Timeout, Do resends
// the identical frame, txid included, up to Retries times, and then fails
// with ErrTimeout (outcome unknown). Responses whose txid is not the one
// awaited are dropped and counted. The first txid is random, so that a
// restarted gateway is unlikely to reuse the txid the device remembers.
//
// A Responder remembers the last request (txid and body) and the response
// it sent. A request with the same txid and the same body is a retry whose
// response was lost: the Responder sends the remembered response again
// without calling its handler. Any other request is applied. One
// remembered transaction suffices because the Link never has two in
// flight; comparing the body too means that a txid reused by a restarted
// gateway for a different command is not mistaken for a retry.
//
// # Ports and the traps of tarm/serial
//
// tarm/serial (2018, no go.mod) works on ttys and ptys but has traps, each
// handled in Port:
//
//  1. When the read timeout expires, Read returns (0, io.EOF), which ends
//     bufio readers and io.Copy. Port.Read returns ErrReadTimeout ("no
//     data yet") instead, and Decoder.Next passes it through while keeping
//     a partly received frame, so the caller just reads again.
//  2. The timeout is termios VTIME, in tenths of a second from 0.1 to 25.5 s.
//     PortConfig.ReadTimeout must be a multiple of 100ms in that range
//     (default 100ms), so what is configured is what the tty does.
//  3. With ReadTimeout 0 (VMIN=1), Close hangs while a Read is blocked
//     (we measured it: Close did not return while a Read waited on an idle
//     pty). ReadTimeout is never 0, so a Read returns within it, and
//     Port.Close marks the port closed and takes the read lock before it
//     calls tarm's Close: the port is closed between two reads of the
//     reading loop, never under one. Conn and Link close the same way.
//  4. There is no exclusive open. OpenPort takes an exclusive flock(2) on
//     the device (advisory, like the lock files of minicom and friends; it
//     also holds for root, unlike TIOCEXCL); a second opener gets
//     ErrPortBusy. tarm then opens the locked descriptor itself through
//     /proc/self/fd, so the lock covers the very device opened even when
//     Path is a udev symlink that was just replaced.
//
// A fifth trap showed up on ptys: when the adapter goes away (or a pty's
// master closes) the tty is hung up, and every Read returns (0, io.EOF) at
// once, which looks exactly like a timeout. After each (0, io.EOF) Port
// asks the tty (TCGETS on the lock's descriptor, which fails with EIO once
// hung up) and returns ErrPortGone when it is gone.
//
// go.bug.st/serial, whose Close unblocks a pending Read, was the
// alternative. We stayed with tarm: with the above, its ports pass the
// unplug, replug and shutdown tests on real ptys, so there was no measured
// reason to switch.
//
// # Unplugging
//
// A Conn keeps one path open. When a read or write fails (ErrPortGone), it
// closes the port (from the reader) and reopens the path with exponential
// backoff and jitter. Meanwhile Write fails at once with ErrPortDown and a
// Link waits in Conn.AwaitUp, then resends its pending request with the
// same txid; attempts that could not be written do not count as retries.
// So across an unplug no request is lost and, thanks to the Responder's
// memory, none is applied twice. A port missing at start is reported by
// OpenConn as an error wrapping ErrPortMissing together with a usable Conn
// that keeps trying, so an agent keeps serving its other devices.
//
// # Goroutines
//
// A Link owns one goroutine, which reads; Close stops it and Done is closed
// when it has stopped. Port, Conn and Responder start none: a Conn is
// reopened by its reader, Serve runs in its caller's goroutine.
//
// Nothing here logs unless given a *slog.Logger; the Stats methods return
// counters for metrics.
package serial
