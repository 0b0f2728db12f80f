package firmware

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// The firmware vectors' operator root (fwjob Config.Manifests) and the
// device's own key: fixed scalars, RFC 6979 signatures, so the header
// regenerates byte for byte.
const (
	fwRootKid      = "root-1"
	fwDeviceKeyKid = "fw-1-dev"
)

var (
	fwRoot      = rawP256(0x0d)
	fwDeviceKey = rawP256(0x0e)
)

func rawP256(b byte) *ecdsa.PrivateKey {
	k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), bytes.Repeat([]byte{b}, 32))
	if err != nil {
		panic(err)
	}
	return k
}

// fwRootKey is the root as the Go device knows it.
func fwRootKey() (*auth.RootKey, error) { return auth.NewRootKey([]byte(fwRootKid), &fwRoot.PublicKey) }

// fwRootPoint is the root's public key, uncompressed (the C port's).
func fwRootPoint() []byte {
	b, err := fwRoot.PublicKey.Bytes()
	if err != nil {
		panic(err)
	}
	return b
}

// mfst is a manifest put together part by part: protected header's map,
// payload, signer; signed over signedPayload if set (a payload changed
// after signing), tail appended after the message.
type mfst struct {
	prot, payload, signedPayload, tail []byte
	signer                             *ecdsa.PrivateKey
	flipSig                            bool
}

func manifestProt(alg []byte, ctype, kid string) []byte {
	return cat(hd(5, 3), u(1), alg, u(3), tstr(ctype), u(4), bstr(kid))
}

func manifestPayload(img []byte, size, version uint64) []byte {
	enc, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	b, err := enc.Marshal(auth.Manifest{Image: img, Size: size, Version: version, Name: "thermostat 3",
		Issued: 1_796_000_000_000})
	if err != nil {
		panic(err)
	}
	return b
}

func (m mfst) bytes() []byte {
	signed := m.payload
	if m.signedPayload != nil {
		signed = m.signedPayload
	}
	sig := es256(m.signer, cat(hd(4, 4), tstr("Signature1"), bstrOf(m.prot), hd(2, 0), bstrOf(signed)))
	if m.flipSig {
		sig[63] ^= 1
	}
	return cat([]byte{0xd2, 0x84}, bstrOf(m.prot), hd(5, 0), bstrOf(m.payload), bstrOf(sig), m.tail)
}

// fwManifestScenarios: a device provisioned with the root refuses every
// forgery devsim refuses (sim/fwjob's tests) and installs the image its
// valid manifest names; a device without it only bounds the field.
func fwManifestScenarios(img []byte) []fwScenario {
	sum := sha256.Sum256(img)
	other := sha256.Sum256([]byte("another image"))
	size := uint64(len(img))
	root := func(payload []byte) mfst {
		return mfst{prot: manifestProt(neg(6), auth.ContentManifest, fwRootKid), payload: payload, signer: fwRoot}
	}
	valid := root(manifestPayload(sum[:], size, 3))
	with := func(f func(m *mfst)) []byte { m := valid; f(&m); return m.bytes() }
	begin := func(man []byte) fwjob.BeginBody {
		return fwjob.BeginBody{Job: "j1", Image: sum[:], Size: size, Version: 3, Chunk: 512, Manifest: man}
	}
	flipped := bytes.Clone(valid.payload)
	flipped[len(flipped)-1] ^= 1 // issued
	s := &fwScript{token: 7}
	for _, man := range [][]byte{
		nil,           // none
		valid.payload, // unsigned
		with(func(m *mfst) {
			m.prot, m.signer = manifestProt(neg(6), auth.ContentManifest, "gw-x"), findKey("gw-x").priv
		}),
		with(func(m *mfst) { m.signer = findKey("gw-a").priv }), // a gateway key under the root's kid
		with(func(m *mfst) {
			m.prot, m.signer = manifestProt(neg(6), auth.ContentManifest, fwDeviceKeyKid), fwDeviceKey
		}),
		with(func(m *mfst) { m.prot = manifestProt(neg(34), auth.ContentManifest, fwRootKid) }), // ES384
		with(func(m *mfst) { m.prot = cat(hd(5, 2), u(3), tstr(auth.ContentManifest), u(4), bstr(fwRootKid)) }),
		with(func(m *mfst) { m.prot = manifestProt(neg(6), auth.ContentCertificate, fwRootKid) }),
		with(func(m *mfst) { m.flipSig = true }),
		with(func(m *mfst) { m.payload, m.signedPayload = flipped, valid.payload }),
		with(func(m *mfst) { m.tail = []byte{0} }),
		append(valid.bytes(), make([]byte, auth.MaxManifestSize)...), // oversize
		root(manifestPayload(other[:], size, 3)).bytes(),
		root(manifestPayload(sum[:], size+1, 3)).bytes(),
		root(manifestPayload(sum[:], size, 4)).bytes(),
		root(manifestPayload(sum[:], 0, 3)).bytes(),
		root(manifestPayload(sum[:31], size, 3)).bytes(),
	} {
		s.cmd(fwjob.KindBegin, begin(man))
	}
	s.cmd(fwjob.KindBegin, begin(valid.bytes()))
	for off := 0; off < len(img); off += 512 {
		s.cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: uint64(off), Data: img[off:min(off+512, len(img))]})
	}
	s.job(fwjob.KindInstall, "j1").job(fwjob.KindActivate, "j1").boot(true).job(fwjob.KindCommit, "j1")
	deposed := fwjob.BeginBody{Job: "j2", Image: sum[:], Size: size, Version: 3, Chunk: 512, Manifest: valid.bytes()}
	s.acts = append(s.acts, fwAction{token: 5, seq: 1, kind: fwjob.KindBegin, body: deposed})
	deposed.Manifest = with(func(m *mfst) { m.signer = findKey("gw-a").priv })
	s.acts = append(s.acts, fwAction{token: 5, seq: 2, kind: fwjob.KindBegin, body: deposed})

	o := &fwScript{token: 7}
	o.cmd("app.set", map[string]any{"v": 1}).cmd("app.other", nil).cmd("fw.reboot", fwjob.JobBody{Job: "j1"}).
		cmd(fwjob.KindBegin, begin(with(func(m *mfst) { m.signer = findKey("gw-a").priv }))). // only bounded
		cmd("app.set", map[string]any{"v": 2}).cmd(fwjob.KindCancel, fwjob.JobBody{Job: "j1"})
	o.acts = append(o.acts, o.acts[4], fwAction{token: 5, seq: 9, kind: "app.set"}) // a duplicate, a deposed holder
	return []fwScenario{
		{name: "signed manifests: the forgeries refused, the valid one installed", actions: s.acts, manifests: true},
		{name: "the application beside the firmware (Config.Other)", actions: o.acts, other: true},
		{name: "the operator's resets: mid-job, a reboot, after commit, replayed", actions: fwResetActions(img, valid.bytes()),
			manifests: true},
	}
}

// fwReset is an operator's reset of the vectors' device signed by signer
// under the root's kid (auth.Root.Reset's bytes: a COSE_Sign1 whose
// payload is resetPayload's), into epoch.
func fwReset(signer *ecdsa.PrivateKey, dev string, t, seq, counter, epoch uint64) []byte {
	return mfst{prot: cat(hd(5, 3), u(1), neg(6), u(3), tstr(auth.ContentReset), u(4), bstr(fwRootKid)),
		payload: resetPayload(dev, t, seq, counter, fmt.Sprintf("reset:fw%d", counter), epoch), signer: signer}.bytes()
}

// fwResetActions: the holder at token 7 begins a job and sends its first
// chunk; the operator resets the mark down to 2/1 (counter 1, epoch 1);
// after a reboot (the job record's tag, 7/2, is not rolled forward over the
// reset) the first chunk captured before the reset, replayed, is stale (its
// epoch is closed) and so is the holder's next; a holder at token 3 in
// epoch 1 — stale before the reset — finishes the job to commit; the reset
// replayed, one signed by a gateway's key, one for another device and one
// of a later counter but the same epoch are refused; a reset up to 50/1
// (counter 2, epoch 2) after the commit, a reboot, and token 7's step of
// epoch 0 and token 3's of epoch 1 are stale, token 50's of epoch 3
// invalid.
func fwResetActions(img, man []byte) []fwAction {
	sum := sha256.Sum256(img)
	at := func(t fence.Token, seq uint64, kind string, body any) fwAction {
		return fwAction{token: t, seq: seq, kind: kind, body: body}
	}
	in := func(epoch uint64, a fwAction) fwAction { a.epoch = epoch; return a }
	chunk := func(t fence.Token, seq uint64, off int) fwAction {
		return at(t, seq, fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: uint64(off), Data: img[off:min(off+512, len(img))]})
	}
	raw := func(b []byte) fwAction { return fwAction{raw: b} }
	down := fwReset(fwRoot, fwDevice, 2, 1, 1, 1)
	return []fwAction{
		at(7, 1, fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: uint64(len(img)), Version: 3, Chunk: 512,
			Manifest: man}),
		chunk(7, 2, 0),
		raw(down),
		{boot: true, healthy: true},
		chunk(7, 2, 0),
		chunk(7, 3, 512),
		in(1, chunk(3, 1, 512)),
		in(1, at(3, 2, fwjob.KindInstall, fwjob.JobBody{Job: "j1"})),
		in(1, at(3, 3, fwjob.KindActivate, fwjob.JobBody{Job: "j1"})),
		{boot: true, healthy: true},
		in(1, at(3, 4, fwjob.KindCommit, fwjob.JobBody{Job: "j1"})),
		raw(down),
		raw(fwReset(findKey("gw-a").priv, fwDevice, 1, 1, 5, 5)),
		raw(fwReset(fwRoot, "fw-2", 1, 1, 5, 5)),
		raw(fwReset(fwRoot, fwDevice, 1, 1, 5, 1)),
		raw(fwReset(fwRoot, fwDevice, 50, 1, 2, 2)),
		{boot: true, healthy: true},
		at(7, 3, fwjob.KindCommit, fwjob.JobBody{Job: "j1"}),
		in(1, at(3, 5, fwjob.KindCommit, fwjob.JobBody{Job: "j1"})),
		in(3, at(50, 2, fwjob.KindCancel, fwjob.JobBody{Job: "j1"})),
		in(2, at(50, 2, fwjob.KindCancel, fwjob.JobBody{Job: "j1"})),
	}
}

// fwApp is the vectors' application (fwjob Config.Other): it takes kind
// app.set; test/fw_vectors.c's app_check is the same in C.
type fwApp struct{}

func (fwApp) Check(env *fence.Envelope) error {
	if env.Kind != "app.set" {
		return fmt.Errorf("app: unknown kind %s", env.Kind)
	}
	return nil
}

func (fwApp) Apply(*fence.Envelope) error { return errors.New("app: transactions only") }

func (fwApp) ApplyTx(*bbolt.Tx, *fence.Envelope) error { return nil }

// rootVerified lists the Sig_structure digests and signatures of the
// scenarios' manifests and resets whose signature the root verifies (ecdsa.Verify, as go-cose's ES256):
// the port's root_verify in a build without ES256 (the Cortex-M runner)
// looks the pair up here, so the manifests' scenarios run there too and
// the manifest path's stack is measured. The host runner verifies with
// mbedTLS.
func rootVerified(scs []fwScenario) [][96]byte {
	var out [][96]byte
	seen := map[[96]byte]bool{}
	for _, sc := range scs {
		for _, a := range sc.actions {
			msg := a.raw // a reset
			if b, ok := a.body.(fwjob.BeginBody); ok {
				msg = b.Manifest
			}
			if len(msg) == 0 {
				continue
			}
			var parts []cbor.RawMessage
			if len(msg) < 2 || cbor.Unmarshal(msg[1:], &parts) != nil || len(parts) != 4 {
				continue // untagged, or not an array of 4
			}
			var prot, payload, sig []byte
			if cbor.Unmarshal(parts[0], &prot) != nil || cbor.Unmarshal(parts[2], &payload) != nil ||
				cbor.Unmarshal(parts[3], &sig) != nil || len(sig) != 64 {
				continue
			}
			d := sha256.Sum256(cat(hd(4, 4), tstr("Signature1"), bstrOf(prot), hd(2, 0), bstrOf(payload)))
			r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
			var ds [96]byte
			copy(ds[:32], d[:])
			copy(ds[32:], sig)
			if ecdsa.Verify(&fwRoot.PublicKey, d[:], r, s) && !seen[ds] {
				seen[ds] = true
				out = append(out, ds)
			}
		}
	}
	return out
}

// rootVerifiedTable writes rootVerified's digests as a C table.
func (w *hdr) rootVerifiedTable(scs []fwScenario) {
	var rows []string
	for _, d := range rootVerified(scs) {
		rows = append(rows, fmt.Sprintf("\t{{%s}, {%s}},\n", cHex(d[:32]), cHex(d[32:])))
	}
	fmt.Fprintf(&w.tables, "/* The Sig_structure digests and signatures of the manifests the root verifies\n"+
		" * (for a root_verify without ES256: the Cortex-M runner). */\n")
	w.table("efs_fwvdigest", "efs_fwv_root_verified", rows)
}

func cHex(d []byte) string {
	var b strings.Builder
	for i, c := range d {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "0x%02x", c)
	}
	return b.String()
}
