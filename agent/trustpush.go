package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/backoff"
)

// Trust updates (invariant I7): a fence point provisioned with only the
// operator's root learns the gateways' certificates, the newest revocation
// list and the fleet's epoch statement over the air. The agent publishes
// a trust update (this gateway's certificate, the newest list and epoch
// statement it knows, auth.MarshalUpdate) retained on the command topic of
// each `auth: required` device it acquires, before the device's first
// command under the new lock, and to every device it holds when the list
// or the epoch changes. With auth.trust_root they are the agent's trust's
// (trust.go: auth.revocations, etcd's, kept in trust.db, each verified
// against the root: the newer wins); without, auth.revocations only.

// TrustRevocationsKey is the etcd key of the newest revocation list
// (root-signed, so whoever can write etcd can deny but not forge).
func TrustRevocationsKey(prefix string) string { return prefix + "/trust/revocations" }

// TrustEpochKey is the etcd key of the fleet's epoch statement (`edgefence keys epoch`), root-signed.
func TrustEpochKey(prefix string) string { return prefix + "/trust/epoch" }

// TrustCertKey is the etcd key of the certificate of the gateway key kid.
func TrustCertKey(prefix, kid string) string { return prefix + "/trust/certs/" + kid }

// TrustDeviceKey is the etcd key of device's certificate (`edgefence keys
// enrol`).
func TrustDeviceKey(prefix, device string) string { return prefix + "/trust/devices/" + device }

// TrustResetKey is the etcd key of the last operator fence reset of device
// (`edgefence fence reset`), root-signed.
func TrustResetKey(prefix, device string) string { return prefix + "/trust/resets/" + device }

// TrustPublisher publishes a trust update on a device's command topic, in
// order with what is published there after it returns. *mqtt.Commander
// satisfies it.
type TrustPublisher interface {
	PublishTrust(ctx context.Context, device string, update []byte) error
}

// TrustUpdates configures the trust updates the agent publishes
// (Options.TrustUpdates).
type TrustUpdates struct {
	// Certificate is this gateway's certificate (auth.certificate).
	Certificate []byte
	// Revocations is the newest list the operator gave this gateway
	// (auth.revocations); nil if none. With auth.trust_root the agent's
	// trust (trust.go) holds it already, verifies every list before it
	// is relayed, and etcd's is watched; without, only this one is
	// relayed, unverified (the devices verify).
	Revocations []byte
	// Publisher publishes the updates (required).
	Publisher TrustPublisher
}

// trustPush publishes trust updates. Its goroutine (run) watches etcd's
// list and pushes to held devices that are owed an update; the delivery
// path calls ensure before each command (trustSender), so that no command
// overtakes the update its device is owed.
type trustPush struct {
	cfg      TrustUpdates
	keep     *keeper // nil: no auth.trust_root
	log      *slog.Logger
	required map[string]bool // `auth: required` devices
	holding  func(dev string) bool

	mu      sync.Mutex
	list    []byte // newest revocation list known; nil if none
	version uint64
	// epochRaw is the fleet's epoch statement relayed (the trust's
	// newest); nil if none.
	epochRaw []byte
	epoch    uint64
	owed     map[string]bool
	pub      map[string]*sync.Mutex // one publish at a time per device (fixed at New)
	wake     chan struct{}
}

func newTrustPush(cfg TrustUpdates, a *Agent) (*trustPush, error) {
	if cfg.Publisher == nil || len(cfg.Certificate) == 0 {
		return nil, errors.New("trust updates: a certificate and a publisher are required")
	}
	p := &trustPush{cfg: cfg, keep: a.keep, log: a.log.With("component", "trust"),
		required: map[string]bool{}, owed: map[string]bool{}, pub: map[string]*sync.Mutex{}, wake: make(chan struct{}, 1),
		holding: func(dev string) bool { _, _, ok := a.leases.holder(dev); return ok }}
	for _, d := range a.cfg.Devices {
		if d.Auth == AuthRequired {
			p.required[d.ID], p.pub[d.ID] = true, new(sync.Mutex)
		}
	}
	if p.keep != nil {
		// The trust holds auth.revocations, and whatever newer list
		// earlier runs kept; any list it learns later is relayed.
		p.list, p.version = p.keep.t.RevocationList()
		p.epochRaw, p.epoch = p.keep.t.EpochStatement()
		p.keep.watch(p.fromTrust)
		return p, nil
	}
	if cfg.Revocations != nil {
		if err := p.setList(cfg.Revocations, "auth.revocations"); err != nil {
			return nil, fmt.Errorf("auth.revocations: %w", err)
		}
	}
	return p, nil
}

// acquired: dev is owed an update before its first command under the new
// lock (nil-safe).
func (p *trustPush) acquired(dev string) {
	if p == nil || !p.required[dev] {
		return
	}
	p.mu.Lock()
	p.owed[dev] = true
	p.mu.Unlock()
	p.kick()
}

// owe makes dev owed its trust update again, to be published before its
// next command, if dev gets trust updates; it reports whether it does
// (nil-safe).
func (p *trustPush) owe(dev string) bool {
	if p == nil || !p.required[dev] {
		return false
	}
	p.mu.Lock()
	p.owed[dev] = true
	p.mu.Unlock()
	return true
}

func (p *trustPush) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// setList relays a revocation list from source (auth.revocations, without
// a trust root: unverified, the devices verify) if it is newer than the
// one relayed.
func (p *trustPush) setList(raw []byte, source string) error {
	r, err := auth.ParseRevocations(raw)
	if err != nil {
		return err
	}
	p.offer(raw, r.Version, source)
	return nil
}

// fromTrust relays the trust's list and epoch statement if either is
// newer than the one relayed (the keeper's watch).
func (p *trustPush) fromTrust() {
	if raw, version := p.keep.t.RevocationList(); raw != nil {
		p.offer(raw, version, "trust")
	}
	raw, epoch := p.keep.t.EpochStatement()
	p.mu.Lock()
	news := epoch > p.epoch
	if news {
		p.epochRaw, p.epoch = raw, epoch
		for dev := range p.required {
			p.owed[dev] = true
		}
	}
	p.mu.Unlock()
	if news {
		p.log.Info("epoch statement to relay", "epoch", epoch)
		p.kick()
	}
}

// offer makes list the one relayed if it is newer: every required device
// is owed an update.
func (p *trustPush) offer(raw []byte, version uint64, source string) {
	p.mu.Lock()
	if p.list != nil && version <= p.version {
		p.mu.Unlock()
		if source != "trust" {
			p.log.Info("revocation list ignored: not newer than the one relayed", "source", source, "version", version, "relayed", p.version)
		}
		return
	}
	p.list, p.version = raw, version
	for dev := range p.required {
		p.owed[dev] = true
	}
	p.mu.Unlock()
	p.log.Info("revocation list to relay", "source", source, "version", version)
	p.kick()
}

// update returns the trust update the devices get now.
func (p *trustPush) update() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	stmts := [][]byte{p.cfg.Certificate}
	if p.list != nil {
		stmts = append(stmts, p.list)
	}
	if p.epochRaw != nil {
		stmts = append(stmts, p.epochRaw)
	}
	return auth.MarshalUpdate(stmts)
}

// ensure publishes dev's trust update if it is owed one (nil-safe). It
// returns once the broker has it (PUBACK): what is published on dev's
// command topic afterwards comes after it.
func (p *trustPush) ensure(ctx context.Context, dev string) error {
	if p == nil || !p.required[dev] {
		return nil
	}
	mu := p.pub[dev]
	mu.Lock()
	defer mu.Unlock()
	p.mu.Lock()
	owed := p.owed[dev]
	p.owed[dev] = false // a list adopted during the publish owes it again
	p.mu.Unlock()
	if !owed {
		return nil
	}
	up, err := p.update()
	if err == nil {
		err = p.cfg.Publisher.PublishTrust(ctx, dev, up)
	}
	if err != nil {
		p.mu.Lock()
		p.owed[dev] = true
		p.mu.Unlock()
		return fmt.Errorf("trust update for %s: %w", dev, err)
	}
	p.log.Debug("trust update published", "device", dev, "bytes", len(up))
	return nil
}

// run pushes owed updates to the devices the agent holds, and follows
// etcd's revocation list, until ctx ends.
func (p *trustPush) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		failed := false
		for _, dev := range p.owedHeld() {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := p.ensure(pctx, dev)
			cancel()
			if err != nil && ctx.Err() == nil {
				failed = true
				p.log.Warn("trust update not published; will retry", "device", dev, "err", err)
			}
		}
		if failed {
			if !backoff.Sleep(ctx, delay.Next()) {
				return
			}
			p.kick()
		} else {
			delay.Reset()
		}
	}
}

// owedHeld returns the devices owed an update that the agent holds.
func (p *trustPush) owedHeld() []string {
	p.mu.Lock()
	var out []string
	for dev, owed := range p.owed {
		if owed {
			out = append(out, dev)
		}
	}
	p.mu.Unlock()
	slices.Sort(out)
	return slices.DeleteFunc(out, func(dev string) bool { return !p.holding(dev) })
}

// trustSender is the agent's Sender with a device's owed trust update
// published before its command.
type trustSender struct {
	Sender
	p *trustPush
}

func (s trustSender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if err := s.p.ensure(ctx, env.Device); err != nil {
		return nil, err // not sent: the delivery worker sends it again
	}
	return s.Sender.Send(ctx, env)
}

// Connected and AwaitConnection pass the link's state on (delivery's link).
func (s trustSender) Connected() bool {
	if l, ok := s.Sender.(link); ok {
		return l.Connected()
	}
	return true
}

func (s trustSender) AwaitConnection(ctx context.Context) error {
	if l, ok := s.Sender.(link); ok {
		return l.AwaitConnection(ctx)
	}
	return nil
}

// withTrustUpdates sets the agent's trust push up from o (nil: none) and
// returns the Sender delivery uses: s, or s with the owed trust update
// published before each command.
func (a *Agent) withTrustUpdates(o *TrustUpdates, s Sender) (Sender, error) {
	if o == nil {
		return s, nil
	}
	p, err := newTrustPush(*o, a)
	if err != nil {
		return nil, err
	}
	a.trust = p
	ts := trustSender{Sender: s, p: p}
	if ps, ok := s.(poster); ok {
		return trustPoster{ts, ps}, nil
	}
	return ts, nil
}

// trustPoster is trustSender over a Sender that can post (post.go).
type trustPoster struct {
	trustSender
	ps poster
}

func (s trustPoster) Post(ctx context.Context, env *fence.Envelope, answer func(*fence.Ack)) error {
	if err := s.p.ensure(ctx, env.Device); err != nil {
		return err // not sent: the delivery worker sends it again
	}
	return s.ps.Post(ctx, env, answer)
}

func (s trustPoster) Drop(id string) bool { return s.ps.Drop(id) }

// runTrust starts the trust push (if any) under ctx; the func returned
// stops it and waits for it.
func (a *Agent) runTrust(ctx context.Context) func() {
	if a.trust == nil {
		return func() {}
	}
	return goUnder(ctx, a.trust.run)
}
