package auth_test

import (
	"crypto/ecdsa"
	"errors"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// device certifies a new device key for dev and returns its signer.
func (c *chain) device(t testing.TB, kid, dev string) *auth.Signer {
	t.Helper()
	return c.certified(t, kid, func(k *ecdsa.PublicKey, nb, na time.Time) ([]byte, error) {
		return c.root.CertifyDevice([]byte(kid), k, dev, nb, na, 1)
	})
}

func ack(dev string, v fence.Verdict) *fence.Ack {
	a := fence.NewAck(env(dev, 7, 3), v, fence.Mark{Token: 7, Seq: 3}, "")
	return &a
}

func TestSignedAck(t *testing.T) {
	c := newChain(t)
	dev := c.device(t, "dev-1/1", "dev-1")
	raw, err := dev.SignAck(ack("dev-1", fence.Accepted))
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > auth.MaxSignedAckSize {
		t.Fatalf("%d bytes", len(raw))
	}
	v, err := auth.VerifyAck(raw, c.trust)
	if err != nil {
		t.Fatal(err)
	}
	if a := v.Ack; a.ID != "c-1" || a.Verdict != fence.Accepted || a.Token != 7 || a.Seq != 3 || string(v.KeyID) != "dev-1/1" {
		t.Fatalf("verified %+v", a)
	}
	if err := auth.BoundTo(v.Ack, env("dev-1", 7, 3)); err != nil {
		t.Fatal(err)
	}
	if claimed, err := auth.ClaimedAck(raw); err != nil || claimed.ID != "c-1" {
		t.Fatalf("claimed %+v, %v", claimed, err)
	}

	other := c.device(t, "dev-2/1", "dev-2")
	gw := c.gateway(t, "gw-a/1", 1, "*")
	plain, _ := fence.MarshalAck(ack("dev-1", fence.Accepted))
	forged, _ := other.SignAck(ack("dev-1", fence.Accepted))
	byGateway, _ := gw.SignAck(ack("dev-1", fence.Accepted))
	asCommand, _ := dev.Sign(env("dev-1", 1<<63, 1))
	state, _ := dev.SignState(&auth.StateReport{Device: "dev-1", Token: 7, Seq: 3, Counter: 1, State: []byte{0xa0}})
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 1
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"unsigned", plain, auth.ErrUnsigned},
		{"another device's key", forged, auth.ErrNotAuthorised},
		{"a gateway key", byGateway, auth.ErrWrongRole},
		{"a command", asCommand, auth.ErrMalformed},
		{"a state report", state, auth.ErrMalformed},
		{"bad signature", flipped, auth.ErrBadSignature},
	} {
		_, err := auth.VerifyAck(tc.raw, c.trust)
		if !errors.Is(err, tc.want) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The home gateway speaks for its fence: gateway devices.
	if _, err := auth.VerifyAck(byGateway, auth.GatewayAcks{Keys: c.trust}); err != nil {
		t.Errorf("gateway-signed ack for a gateway-fenced device: %v", err)
	}
	if _, err := auth.VerifyAck(raw, auth.GatewayAcks{Keys: c.trust}); !errors.Is(err, auth.ErrWrongRole) {
		t.Errorf("device key for a gateway-fenced device: %v", err)
	}
	// Bound to the command: the right signature on another (token, seq).
	for _, e := range []*fence.Envelope{env("dev-1", 8, 3), env("dev-1", 7, 4), env("dev-2", 7, 3)} {
		if err := auth.BoundTo(v.Ack, e); !errors.Is(err, auth.ErrNotBound) {
			t.Errorf("ack bound to %+v: %v", e, err)
		}
	}
}

// A device key never signs a command, whatever it claims: Trust.Key
// refuses it (a stolen device cannot raise any mark), and a revoked device
// key no longer speaks for its device.
func TestDeviceKeyRoles(t *testing.T) {
	c := newChain(t)
	dev := c.device(t, "dev-1/1", "dev-1")
	raw, err := dev.Sign(env("dev-1", 1<<63, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Verify(raw, c.trust); !errors.Is(err, auth.ErrWrongRole) || !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("command signed by a device key: %v", err)
	}
	k := newKey(t)
	if _, err := c.root.CertifyDevice([]byte("x"), &k.PublicKey, "dev-*", c.now, c.now.Add(time.Hour), 1); err == nil {
		t.Error("device certificate for a wildcard")
	}
	list, err := c.root.Revoke(1, [][]byte{[]byte("dev-1/1")}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.trust.ApplyRevocations(list); err != nil {
		t.Fatal(err)
	}
	a, _ := dev.SignAck(ack("dev-1", fence.Accepted))
	if _, err := auth.VerifyAck(a, c.trust); !errors.Is(err, auth.ErrRevoked) {
		t.Errorf("revoked device key: %v", err)
	}
	c.now = c.now.Add(48 * time.Hour)
	other := c.device(t, "dev-2/1", "dev-2")
	c.now = c.now.Add(48 * time.Hour)
	a, _ = other.SignAck(ack("dev-2", fence.Accepted))
	if _, err := auth.VerifyAck(a, c.trust); !errors.Is(err, auth.ErrExpired) {
		t.Errorf("expired device key: %v", err)
	}
}

func TestSignedState(t *testing.T) {
	c := newChain(t)
	dev := c.device(t, "dev-1/1", "dev-1")
	r := &auth.StateReport{Device: "dev-1", Token: 7, Seq: 3, Counter: 10, State: []byte{0xa1, 0x61, 0x73, 0x18, 0x15}}
	raw, err := dev.SignState(r)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.VerifyState(raw, c.trust)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Report; got.Device != "dev-1" || got.Mark() != r.Mark() || got.Counter != 10 || string(got.State) != string(r.State) {
		t.Fatalf("verified %+v", got)
	}
	for _, tc := range []struct {
		next  auth.StateReport
		after bool
	}{
		{auth.StateReport{Token: 7, Seq: 3, Counter: 10}, false},
		{auth.StateReport{Token: 7, Seq: 3, Counter: 9}, false},
		{auth.StateReport{Token: 7, Seq: 2, Counter: 99}, false},
		{auth.StateReport{Token: 6, Seq: 9, Counter: 99}, false},
		{auth.StateReport{Token: 7, Seq: 3, Counter: 11}, true},
		{auth.StateReport{Token: 7, Seq: 4, Counter: 0}, true},
		{auth.StateReport{Token: 8, Seq: 1, Counter: 0}, true},
	} {
		if got := tc.next.After(v.Report); got != tc.after {
			t.Errorf("%+v after %+v: %v", tc.next, v.Report, got)
		}
	}
	other := c.device(t, "dev-2/1", "dev-2")
	forged, _ := other.SignState(r)
	ackRaw, _ := dev.SignAck(ack("dev-1", fence.Accepted))
	if _, err := auth.VerifyState(forged, c.trust); !errors.Is(err, auth.ErrNotAuthorised) {
		t.Errorf("another device's key: %v", err)
	}
	if _, err := auth.VerifyState(ackRaw, c.trust); !errors.Is(err, auth.ErrMalformed) {
		t.Errorf("an ack as a state report: %v", err)
	}
	if _, err := auth.VerifyState([]byte{0xa1, 0x61, 0x73, 0x18, 0x15}, c.trust); !errors.Is(err, auth.ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
	if _, err := dev.SignState(&auth.StateReport{Device: "dev-1", State: []byte{0x18, 0x15}}); err == nil {
		t.Error("a state that is not a map was signed")
	}
}

func FuzzVerifyAck(f *testing.F) {
	c := newChain(f)
	dev := c.device(f, "dev-1/1", "dev-1")
	good, err := dev.SignAck(ack("dev-1", fence.Stale))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0x40, 0x40})
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := auth.VerifyAck(raw, c.trust)
		if err == nil && (v == nil || v.Ack == nil || v.Ack.Device != "dev-1") {
			t.Fatalf("accepted %+v", v)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("refusal does not wrap fence.ErrInvalid: %v", err)
		}
		_, _ = auth.ClaimedAck(raw) // never panics
	})
}

func FuzzVerifyState(f *testing.F) {
	c := newChain(f)
	dev := c.device(f, "dev-1/1", "dev-1")
	good, err := dev.SignState(&auth.StateReport{Device: "dev-1", Token: 1, Seq: 1, Counter: 1, State: []byte{0xa0}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0x40, 0x40})
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := auth.VerifyState(raw, c.trust)
		if err == nil && (v == nil || v.Report == nil || v.Report.Device != "dev-1") {
			t.Fatalf("accepted %+v", v)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("refusal does not wrap fence.ErrInvalid: %v", err)
		}
	})
}

// BenchmarkAckSignVerify is what a signed ack costs per command: the device
// signs it, the agent verifies it and checks it answers the command.
func BenchmarkAckSignVerify(b *testing.B) {
	c := newChain(b)
	dev := c.device(b, "dev-1/1", "dev-1")
	a, e := ack("dev-1", fence.Accepted), env("dev-1", 7, 3)
	b.Run("sign", func(b *testing.B) {
		for b.Loop() {
			if _, err := dev.SignAck(a); err != nil {
				b.Fatal(err)
			}
		}
	})
	raw, err := dev.SignAck(a)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			v, err := auth.VerifyAck(raw, c.trust)
			if err != nil {
				b.Fatal(err)
			}
			if err := auth.BoundTo(v.Ack, e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
