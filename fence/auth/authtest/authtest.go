// Package authtest is an operator's trust chain for tests, as httptest is
// a server: a root key, gateway keys it certified, revocation lists, and
// Trusts anchored at the root.
package authtest

import (
	"crypto/ecdsa"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence/auth"
)

// RootKID is the operator root's key id.
const RootKID = "operator"

// Operator holds a root key and signs with it.
type Operator struct {
	t    testing.TB
	Key  *ecdsa.PrivateKey
	Root *auth.Root
}

// NewOperator returns an operator with a new root key, named RootKID.
func NewOperator(t testing.TB) *Operator {
	t.Helper()
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	r, err := auth.NewRoot([]byte(RootKID), k)
	if err != nil {
		t.Fatal(err)
	}
	return &Operator{t: t, Key: k, Root: r}
}

// Trust returns a new Trust anchored at the root only (the clock is
// time.Now), as a fence point is provisioned.
func (o *Operator) Trust() *auth.Trust {
	o.t.Helper()
	tr, err := auth.NewTrust([]byte(RootKID), &o.Key.PublicKey, nil)
	if err != nil {
		o.t.Fatal(err)
	}
	return tr
}

// Gateway is a gateway key the operator certified.
type Gateway struct {
	Key    *ecdsa.PrivateKey
	Signer *auth.Signer
	Cert   []byte // the root-signed certificate
}

// Certify returns a new gateway key named kid, certified (serial 1) for
// devices from an hour ago for a day.
func (o *Operator) Certify(kid string, devices ...string) *Gateway {
	o.t.Helper()
	k, err := auth.NewKey()
	if err != nil {
		o.t.Fatal(err)
	}
	cert, err := o.Root.Certify([]byte(kid), &k.PublicKey, devices, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), 1)
	if err != nil {
		o.t.Fatal(err)
	}
	s, err := auth.NewSigner([]byte(kid), k)
	if err != nil {
		o.t.Fatal(err)
	}
	return &Gateway{Key: k, Signer: s, Cert: cert}
}

// Revoke returns a revocation list of version revoking kids.
func (o *Operator) Revoke(version uint64, kids ...string) []byte {
	o.t.Helper()
	var list [][]byte
	for _, k := range kids {
		list = append(list, []byte(k))
	}
	raw, err := o.Root.Revoke(version, list, time.Now())
	if err != nil {
		o.t.Fatal(err)
	}
	return raw
}

// Update returns the trust update carrying stmts.
func Update(t testing.TB, stmts ...[]byte) []byte {
	t.Helper()
	raw, err := auth.MarshalUpdate(stmts)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Manifest returns the image manifest m signed by the root.
func (o *Operator) Manifest(m auth.Manifest) []byte {
	o.t.Helper()
	raw, err := o.Root.Manifest(m)
	if err != nil {
		o.t.Fatal(err)
	}
	return raw
}

// Epoch returns the root's statement that the fleet is at epoch n.
func (o *Operator) Epoch(n uint64) []byte {
	o.t.Helper()
	raw, err := o.Root.Epoch(n, time.Now())
	if err != nil {
		o.t.Fatal(err)
	}
	return raw
}

// Reset returns the reset r signed by the root.
func (o *Operator) Reset(r auth.Reset) []byte {
	o.t.Helper()
	raw, err := o.Root.Reset(r)
	if err != nil {
		o.t.Fatal(err)
	}
	return raw
}
