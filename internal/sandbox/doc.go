// Package sandbox is the embedded default world: a real single-node etcd and
// a real MQTT v5 broker on loopback, for `make demo`, the edgefence-sandbox
// binary and the integration tests of other packages.
//
// Everything here is real — embedded etcd (go.etcd.io/etcd/server/v3/embed),
// an in-process mochi-mqtt v2 broker, and optionally the Debian mosquitto
// binary as a subprocess — so tests exercise leases, fencing and MQTT v5
// delivery without mocks. Nothing here is meant for production: data lives in
// a caller-chosen directory, brokers allow everyone, and nothing persists
// except etcd's data dir.
//
// Each server owns its goroutines (or subprocess): Close stops it and waits,
// and is idempotent and safe after a failed start. Stop and Start (and
// Restart, which is both) keep the same address and, for etcd, the same data
// dir, so fault tests can take a server away and bring it back where clients
// expect it.
//
// Library code logs nothing unless given a *slog.Logger.
package sandbox
