package fwjob_test

import (
	"errors"
	"testing"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
)

// signedFor is the manifest of im as the operator releases it.
func signedFor(im image) auth.Manifest {
	return auth.Manifest{Image: im.sum(), Size: uint64(len(im.data)), Version: im.version, Name: "thermo " + im.job}
}

// withManifest is im's fw.begin carrying manifest.
func withManifest(im image, manifest []byte) fwjob.BeginBody {
	b := im.begin()
	b.Manifest = manifest
	return b
}

// A device provisioned with the operator's root installs only images whose
// manifest the root signed for exactly that image, size and version: every
// other fw.begin is refused invalid ("manifest: …") and neither the mark nor
// the job moves — whoever signs the command, even a gateway the root
// certified for the device.
func TestManifestRequired(t *testing.T) {
	op := authtest.NewOperator(t)
	im := small
	r := newRig(t, fwjob.BootConfig{})
	r.cfg.Manifests = op.Trust()
	var err error
	if r.d, err = fwjob.New(r.cfg); err != nil {
		t.Fatal(err)
	}
	gw := op.Certify("gw-a/1", dev)
	gwAsRoot, _ := auth.NewRoot([]byte(authtest.RootKID), gw.Key)
	gwAsItself, _ := auth.NewRoot([]byte("gw-a/1"), gw.Key)
	sign := func(root *auth.Root, m auth.Manifest) []byte {
		raw, err := root.Manifest(m)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	good := op.Manifest(signedFor(im))
	other := newImage("j1", 250, 3, 100)
	other.data[0] ^= 1
	bigger, older := signedFor(im), signedFor(im)
	bigger.Size++
	older.Version--
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-10] ^= 0x04
	reset, _ := op.Root.Reset(auth.Reset{Device: dev, Token: 1, Seq: 1, Counter: 1, ID: "reset:x", Epoch: 1})
	for _, tc := range []struct {
		name     string
		manifest []byte
		want     string
	}{
		{"none", nil, "manifest: none"},
		{"another operator", authtest.NewOperator(t).Manifest(signedFor(im)), "bad signature"},
		{"a certified gateway's key under the root's kid", sign(gwAsRoot, signedFor(im)), "bad signature"},
		{"a certified gateway's key in its own name", sign(gwAsItself, signedFor(im)), "unknown signer key"},
		{"another image", op.Manifest(signedFor(other)), "manifest: signed for image"},
		{"another size", op.Manifest(bigger), "manifest: signed for image"},
		{"another version", op.Manifest(older), "manifest: signed for image"},
		{"a bit flipped", flipped, "manifest:"},
		{"a reset statement", reset, "content type"},
		{"oversized", make([]byte, auth.MaxManifestSize+1), "manifest of 1025 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.refused(fwjob.KindBegin, withManifest(im, tc.manifest), tc.want)
		})
	}
	r.t = t
	// The refusal is ErrManifest for a caller of Check.
	env, err := fence.UnmarshalEnvelope(r.env(fwjob.KindBegin, withManifest(im, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.d.Check(env); !errors.Is(err, fwjob.ErrManifest) {
		t.Fatalf("Check: %v, want ErrManifest", err)
	}
	if st := r.status(); st.State != fwjob.Idle {
		t.Fatalf("state %s after refusals", st.State)
	}

	// The operator's manifest: the job runs as without one.
	if st := r.must(fwjob.KindBegin, withManifest(im, good)); st.State != fwjob.Downloading {
		t.Fatalf("state %s", st.State)
	}
	if st := r.download(im); st.State != fwjob.Downloaded {
		t.Fatalf("state %s after the download", st.State)
	}
}

// A device that knows only the root key (auth.RootKey) checks manifests
// the same; one without Config.Manifests ignores them.
func TestManifestRootKeyAndOff(t *testing.T) {
	op := authtest.NewOperator(t)
	im := small
	r := newRig(t, fwjob.BootConfig{})
	var err error
	if r.cfg.Manifests, err = auth.NewRootKey([]byte(authtest.RootKID), &op.Key.PublicKey); err != nil {
		t.Fatal(err)
	}
	if r.d, err = fwjob.New(r.cfg); err != nil {
		t.Fatal(err)
	}
	r.refused(fwjob.KindBegin, withManifest(im, authtest.NewOperator(t).Manifest(signedFor(im))), "bad signature")
	r.must(fwjob.KindBegin, withManifest(im, op.Manifest(signedFor(im))))

	off := newRig(t, fwjob.BootConfig{})
	off.must(fwjob.KindBegin, withManifest(im, []byte("not a manifest")))
}
