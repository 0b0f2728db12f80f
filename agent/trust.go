package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence/auth"
)

// The operator's trust chain as this agent knows it (invariants I7, I8):
// one auth.Trust anchored at auth.trust_root, holding this gateway's
// certificate (auth.certificate), the newest revocation list
// (auth.revocations, then etcd's) and the certificates etcd gave for the
// devices whose acks it checks. deviceAuth verifies acks and state
// reports with it, trustPush relays its list, and the leases ask it
// whether this gateway may command a device at all (mayCommand).
//
// Every statement learned after start is committed to the keeper's ledger
// (Options.TrustDB, bucket trustBucket, fsync) before it takes effect,
// and the ledger is replayed at start: a restart keeps what the agent
// verified, and so does an etcd that was rebuilt without it — the agent
// puts it back there (republish.go).

// trustBucket is the bucket of Options.TrustDB holding the statements.
var trustBucket = []byte("agent.trust")

// keeper holds the agent's trust. Its methods are safe for concurrent
// use; mu is a leaf lock.
type keeper struct {
	t      *auth.Trust
	ledger *auth.Ledger
	kid    []byte // auth.key_id; nil: this gateway has no certificate to check
	log    *slog.Logger

	mu       sync.Mutex
	watchers []func()      // called after a statement took effect
	news     chan struct{} // closed when a statement takes effect (changes)
}

// newKeeper returns the trust anchored at cfg's auth.trust_root, with the
// statements db keeps (nil: memory only) replayed into it; nil without a
// trust root.
func newKeeper(cfg *Config, db *bbolt.DB, log *slog.Logger, now func() time.Time) (*keeper, error) {
	a := cfg.Auth
	t, err := a.OperatorTrust(now)
	if t == nil || err != nil {
		return nil, err
	}
	k := &keeper{t: t, log: log.With("component", "trust")}
	if a.Certificate != "" {
		k.kid = []byte(a.KeyID)
	}
	var got auth.Learned
	if k.ledger, got, err = auth.OpenLedger(t, db, trustBucket); err != nil {
		return nil, fmt.Errorf("trust store: %w", err)
	}
	if got.Applied > 0 {
		k.log.Info("trust statements kept from earlier runs taken in", "statements", got.Applied, "revocation_version", t.Version())
	}
	return k, nil
}

// learn takes in raw, a statement of the root read from source, if it is
// newer than the one held in its slot: committed to the ledger first,
// then in effect. It reports whether it was news; an older or held one is
// not (nil error); one that is not the root's is an error.
func (k *keeper) learn(raw []byte, source string) (*auth.Statement, bool, error) {
	st, err := k.t.Check(raw)
	switch {
	case errors.Is(err, auth.ErrHeld), errors.Is(err, auth.ErrStaleTrust):
		return st, false, nil
	case err != nil:
		return nil, false, err
	}
	up, err := auth.MarshalUpdate([][]byte{raw})
	if err != nil {
		return nil, false, err
	}
	got, err := k.ledger.Learn(up)
	if err != nil {
		return nil, false, err
	}
	if got.Applied == 0 {
		return st, false, nil // something at least as new came in meanwhile
	}
	k.log.Info("trust statement learned", "source", source, "content", st.Content, "slot", st.Slot(), "rank", st.Rank())
	k.changed()
	return st, true, nil
}

// watch makes f run after each statement that takes effect.
func (k *keeper) watch(f func()) {
	k.mu.Lock()
	k.watchers = append(k.watchers, f)
	k.mu.Unlock()
}

// changes returns a channel closed when the next statement takes effect
// (never, for a nil keeper).
func (k *keeper) changes() <-chan struct{} {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.news == nil {
		k.news = make(chan struct{})
	}
	return k.news
}

func (k *keeper) changed() {
	k.mu.Lock()
	ws := k.watchers
	if k.news != nil {
		close(k.news)
		k.news = nil
	}
	k.mu.Unlock()
	for _, f := range ws {
		f()
	}
}

// mayCommand says whether this gateway's own certificate lets it command
// dev now: nil, or why not (revoked, expired or not yet valid, not naming
// dev). Without a certificate of its own (the devices were given it some
// other way) it cannot tell, and says nil.
func (k *keeper) mayCommand(dev string) error {
	if k == nil || k.kid == nil {
		return nil
	}
	_, err := k.t.Key(k.kid, dev)
	return err
}

// ownCertificate returns this gateway's certificate as the trust holds it
// (nil without one).
func (k *keeper) ownCertificate(cfg AuthConfig) *auth.Certificate {
	if k == nil || k.kid == nil {
		return nil
	}
	raw, err := os.ReadFile(cfg.Certificate)
	if err != nil {
		return nil
	}
	st, _ := k.t.Check(raw) // held: the statement comes back with ErrHeld
	if st == nil {
		return nil
	}
	return st.Certificate
}

// TrustStatus describes the agent's trust (Status.Trust): this gateway's
// own certificate as the newest statements judge it, what the agent
// keeps, and the devices it left because it cannot command them with
// trust.
type TrustStatus struct {
	KeyID string `json:"key_id,omitempty"` // auth.key_id of this gateway's certificate
	// CertificateOK is false when this gateway's own certificate is
	// revoked, expired or not yet valid (CertificateProblem says which):
	// it leaves every `auth: required` device.
	CertificateOK      bool      `json:"certificate_ok"`
	CertificateProblem string    `json:"certificate_problem,omitempty"`
	NotAfter           time.Time `json:"certificate_not_after,omitzero"`
	RevocationVersion  uint64    `json:"revocation_version"`
	Statements         int       `json:"statements"`            // root-signed statements kept (certificates, the list)
	Republished        uint64    `json:"republished,omitempty"` // put back into etcd after it lost them
	// Releases counts the devices left because this gateway cannot
	// command them with trust, by reason (own_certificate,
	// signer_refused, acks_unverified).
	Releases map[string]uint64 `json:"releases,omitempty"`
}

// status returns the trust's status (nil without a trust root).
func (a *Agent) trustStatus() *TrustStatus {
	k := a.keep
	if k == nil {
		return nil
	}
	st := &TrustStatus{CertificateOK: true, RevocationVersion: k.t.Version(), Statements: len(k.t.Statements())}
	if a.repub != nil {
		st.Republished = a.repub.done.Load()
	}
	if c := k.ownCertificate(a.cfg.Auth); c != nil {
		st.KeyID, st.NotAfter = string(c.KeyID), time.Unix(c.NotAfter, 0).UTC()
		if _, err := k.t.Key(c.KeyID, ""); err != nil && !errors.Is(err, auth.ErrNotAuthorised) {
			st.CertificateOK, st.CertificateProblem = false, err.Error()
		}
	}
	for i, r := range untrustReasons {
		if n := a.leases.stats.untrusted[i].Load(); n > 0 {
			if st.Releases == nil {
				st.Releases = map[string]uint64{}
			}
			st.Releases[r] = n
		}
	}
	return st
}

// startTrust starts what keeps the agent's trust current, before the
// first campaigns: the trust updates (trustpush.go), the republisher
// (republish.go), the watch on this gateway's own certificate
// (untrusted.go), and with a trust root the fleet's epoch (epoch.go), the
// statements followed in etcd (trustwatch.go) and the devices'
// certificates read ahead (trustfetch.go). The func returned stops them
// and waits for them.
func (a *Agent) startTrust(ctx context.Context) func() {
	stops := []func(){a.runTrust(ctx), a.runRepublish(ctx), goUnder(ctx, a.leases.watchOwnTrust)}
	if a.keep != nil {
		if e := a.keep.t.Epoch(); e > a.fleetAt && a.fleetEpoch(e) == nil {
			a.fleetAt = e
		}
		stops = append(stops, goUnder(ctx, func(ctx context.Context) { a.runEpochs(ctx, a.fleetAt) }))
		if a.cli != nil {
			prefix := a.cfg.Etcd.Prefix
			stops = append(stops, goUnder(ctx, func(ctx context.Context) { a.keep.follow(ctx, a.cli, prefix, a.resetFromEtcd) }),
				goUnder(ctx, func(ctx context.Context) { a.keep.prefetch(ctx, a.cli, prefix, a.selfSigned()) }))
		}
	}
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
}
