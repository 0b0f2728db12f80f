package bridge

import (
	"fmt"

	"github.com/edgefence/edgefence/fence/auth"
)

// trustBucket holds the trust statements the gateway fence learned over
// the air (auth.Ledger), in Config.TrustDB.
var trustBucket = []byte("bridge.trust")

// openLedger makes the bridge learn trust updates when Config.Keys is an
// *auth.Trust: what it learned before is replayed into the Trust first.
func (b *Bridge) openLedger() error {
	tr, ok := b.cfg.Keys.(*auth.Trust)
	if !ok {
		return nil
	}
	if b.cfg.TrustDB == nil {
		b.log.Warn("trust updates are kept in memory only (no TrustDB): a restart forgets what they brought")
	}
	l, replay, err := auth.OpenLedger(tr, b.cfg.TrustDB, trustBucket)
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	b.ledger = l
	replay.Log(b.log, tr, true, "by", "fence table")
	return nil
}

// learn takes in a trust update that arrived on dev's command topic, as
// the device shim does (devices/shim: trust.go): each newer statement is
// committed (fsync) before it takes effect; no mark moves, no ack.
func (b *Bridge) learn(dev string, raw []byte) {
	got, _ := b.ledger.Learn(raw) // every refusal is in got.Refusals
	b.trust.Add(got)
	got.Log(b.log, b.ledger.Trust(), false, "device", dev, "by", "fence table")
}
