// Package serial is edgefence's serial transport for legacy devices that
// cannot check fencing tokens: the gateway admits each command against its
// fence table, then sends it here. It provides
//
//   - Encode and a resynchronising Decoder for the frame
//     0x00 | COBS(payload | CRC-32C(payload), big-endian) | 0x00,
//     payloads of 1 byte to 1 KiB by default (a limit up to 64 KiB). A
//     Decoder never delivers a frame whose CRC fails: noise, truncated,
//     corrupt and oversize frames are dropped and counted (FrameStats), with
//     memory bounded by the limit;
//   - Link, the gateway's side: one transaction at a time, payload header
//     version(1) | type(1: request, 2: response) | txid(4, BE) | body; on
//     LinkConfig.Timeout Do resends the identical frame (same txid) up to
//     Retries times, then fails with ErrTimeout (outcome unknown);
//   - Responder (and Serve), the device's side: it applies each request once
//     and answers a retry (same txid and body) from memory;
//   - Port, one open tty (tarm/serial) with an exclusive flock (ErrPortBusy),
//     ErrReadTimeout for "no data yet" and ErrPortGone on hang-up; and Conn,
//     which reopens its path with backoff after an unplug (Write fails with
//     ErrPortDown meanwhile; OpenConn wraps ErrPortMissing but returns a
//     usable Conn). A Link over a Conn resends its pending request after a
//     replug, so no request is lost and none is applied twice.
//
// Goroutines: a Link owns one, its reader; Close stops it and Done is closed
// when it has. Port, Conn and Responder start none; Serve runs in its
// caller's goroutine. Nothing logs unless given a *slog.Logger; the Stats
// methods return counters for metrics.
//
// Why COBS and CRC-32C, the traps of tarm/serial and how Port handles them:
// docs/ARCHITECTURE.md, "Serial transport".
package serial
