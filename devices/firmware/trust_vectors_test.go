package firmware

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence/auth"
)

// The trust vectors: trust updates (auth.MarshalUpdate's format) of
// root-signed certificates, revocation lists and epoch statements, each
// decided by the Go side (auth.ParseUpdate, then Trust.Check of every
// statement on a fresh Trust: taken or refused whole; taken, the fleet
// epoch it then holds) and by efsdev's trust.c
// (efsdev_trust_update) in test/trust_host.c; the fuzz target
// fuzz/fuzz_trust.c is seeded from them. The keys are the signed vectors'
// (fixed scalars, RFC 6979 signatures), so the header regenerates byte for
// byte.

const trustVectorsPath = "testdata/trust_vectors.h"

// TestTrustVectorsCurrent fails if testdata/trust_vectors.h differs from what
// the Go side generates now (-update writes it).
func TestTrustVectorsCurrent(t *testing.T) {
	checkGenerated(t, trustVectorsPath, generateTrustVectors)
}

// certPayload is a certificate's payload for kid's key, written with the
// heads of w (shortest: hd).
func certPayload(w func(major byte, v uint64) []byte, kid string, devices ...string) []byte {
	pt, err := findKey(kid).priv.PublicKey.Bytes()
	if err != nil {
		panic(err)
	}
	devs := w(4, uint64(len(devices)))
	for _, d := range devices {
		devs = append(append(devs, w(3, uint64(len(d)))...), d...)
	}
	key := cat(w(5, 4), w(0, 1), w(0, 2), w(1, 0), w(0, 1), w(1, 1), w(2, 32), pt[1:33], w(1, 2), w(2, 32), pt[33:])
	return cat(w(5, 6), w(0, 1), w(2, uint64(len(kid))), []byte(kid), w(0, 2), key, w(0, 3), devs,
		w(0, 4), w(0, 1700000000), w(0, 5), w(0, 4000000000), w(0, 6), w(0, 1))
}

// long writes every head one size wider than shortest (up to 8 bytes).
func long(major byte, v uint64) []byte {
	switch {
	case v < 24:
		return hw(major, 24, v)
	case v <= 0xff:
		return hw(major, 25, v)
	case v <= 0xffff:
		return hw(major, 26, v)
	default:
		return hw(major, 27, v)
	}
}

// statement is a root statement of content type ct over payload.
func statement(signer, ct string, payload []byte) *cose {
	return &cose{prefix: []byte{0xd2, 0x84}, protected: cat(hd(5, 3), u(1), neg(6), u(3), tstr(ct), u(4), bstr(signer)),
		pbstr: bstrOf, unprotected: hd(5, 0), payload: bstrOf(payload), signer: signer}
}

func revPayload(version uint64, kids ...string) []byte {
	b := cat(hd(5, 3), u(1), u(version), u(2), hd(4, uint64(len(kids))))
	for _, k := range kids {
		b = append(b, bstr(k)...)
	}
	return cat(b, u(3), u(1700000000))
}

// trustUpdate wraps statements as auth.MarshalUpdate does.
func trustUpdate(stmts ...[]byte) []byte {
	b, err := auth.MarshalUpdate(stmts)
	if err != nil {
		panic(err)
	}
	return b
}

// trustCorpus is every trust input: valid updates, every head in a longer
// form (taken, as Go's decoder takes them) in the statements and refused
// in the update's own array, forgeries, fields of the wrong type,
// truncations and mutations.
func trustCorpus() []decodeCase {
	cert := statement("operator", auth.ContentCertificate, certPayload(hd, "gw-a", "dev-a", "dev-b*")).bytes()
	list := statement("operator", auth.ContentRevocations, revPayload(1, "gw-x")).bytes()
	var cs []decodeCase
	add := func(name string, in []byte) { cs = append(cs, decodeCase{name, in}) }
	certWith := func(name string, p []byte) {
		add("certificate: "+name, trustUpdate(statement("operator", auth.ContentCertificate, p).bytes()))
	}
	add("certificate", trustUpdate(cert))
	add("revocation list", trustUpdate(list))
	add("certificate and list", trustUpdate(cert, list))
	certWith("every head one size longer", certPayload(long, "gw-a", "dev-a"))
	certWith("device certificate", cat(certPayload(hd, "gw-b", "dev-b")[:0], bytes.Replace(certPayload(hd, "gw-b", "dev-b"), []byte{0xa6}, []byte{0xa7}, 1), u(7), u(1)))
	certWith("role 5", cat(bytes.Replace(certPayload(hd, "gw-b", "dev-b"), []byte{0xa6}, []byte{0xa7}, 1), u(7), u(5)))
	certWith("device certificate for two", cat(bytes.Replace(certPayload(hd, "gw-b", "dev-a", "dev-b"), []byte{0xa6}, []byte{0xa7}, 1), u(7), u(1)))
	certWith("a device that is a number", bytes.Replace(certPayload(hd, "gw-a", "dev-a"), cat(hd(4, 1), tstr("dev-a")), cat(hd(4, 1), u(7)), 1))
	certWith("a device not UTF-8", bytes.Replace(certPayload(hd, "gw-a", "dev-a"), tstr("dev-a"), cat(hd(3, 5), []byte("dev-\xff")), 1))
	certWith("no devices", bytes.Replace(certPayload(hd, "gw-a", "dev-a"), cat(hd(4, 1), tstr("dev-a")), hd(4, 0), 1))
	certWith("window reversed", bytes.Replace(certPayload(hd, "gw-a", "dev-a"), cat(u(4), hd(0, 1700000000)), cat(u(4), hd(0, 4100000000)), 1))
	certWith("trailing byte", append(certPayload(hd, "gw-a", "dev-a"), 0))
	certWith("tagged serial", bytes.Replace(certPayload(hd, "gw-a", "dev-a"), cat(u(6), u(1)), cat(u(6), []byte{0xc1}, u(1)), 1))
	add("revocation list: version in 9 bytes", trustUpdate(statement("operator", auth.ContentRevocations,
		cat(hd(5, 3), u(1), hw(0, 27, 2), u(2), hd(4, 1), bstr("gw-x"), u(3), u(1))).bytes()))
	add("revocation list: a key id that is text", trustUpdate(statement("operator", auth.ContentRevocations,
		cat(hd(5, 3), u(1), u(2), u(2), hd(4, 1), tstr("gw-x"), u(3), u(1))).bytes()))
	add("revocation list: version twice", trustUpdate(statement("operator", auth.ContentRevocations,
		cat(hd(5, 3), u(1), u(2), u(1), u(3), u(2), hd(4, 0))).bytes()))
	add("revocation list: no key ids", trustUpdate(statement("operator", auth.ContentRevocations,
		cat(hd(5, 2), u(1), u(2), u(2), hd(4, 0))).bytes()))
	for _, c := range trustNulls() {
		add(c.name, c.in)
	}
	add("certificate: serial 2^64-1", trustUpdate(statement("operator", auth.ContentCertificate,
		bytes.Replace(certPayload(hd, "gw-a", "dev-a"), cat(u(6), u(1)), cat(u(6), hd(0, 1<<64-1)), 1)).bytes()))
	add("signed by gw-a", trustUpdate(statement("gw-a", auth.ContentCertificate, certPayload(hd, "gw-b", "dev-b")).bytes()))
	forged := statement("operator", auth.ContentCertificate, certPayload(hd, "gw-b", "*"))
	forged.signer = "gw-a"
	add("gw-a's signature, the root's kid", trustUpdate(forged.bytes()))
	add("unknown content type", trustUpdate(statement("operator", "application/x", certPayload(hd, "gw-a", "dev-a")).bytes()))
	un := statement("operator", auth.ContentCertificate, certPayload(hd, "gw-a", "dev-a"))
	un.unprotected = hw(5, 24, 0)
	add("unprotected empty map in 2 bytes", trustUpdate(un.bytes()))
	al := statement("operator", auth.ContentCertificate, certPayload(hd, "gw-a", "dev-a"))
	al.protected = cat(hd(5, 3), u(1), hw(1, 24, 6), hw(0, 25, 3), tstr(auth.ContentCertificate), u(4), bstr("operator"))
	add("protected heads longer", trustUpdate(al.bytes()))
	// The update's own heads: shortest only (auth.ParseUpdate).
	add("update: statement head one size longer", cat([]byte{0x81}, hw(2, 25, uint64(len(cert))), cert))
	add("update: statement head in 8 bytes", cat([]byte{0x81}, hw(2, 27, uint64(len(cert))), cert))
	add("update: array head in 2 bytes", cat(hw(4, 24, 1), bstrOf(cert)))
	add("update: empty statement", []byte{0x81, 0x40})
	add("update: trailing byte", append(trustUpdate(cert), 0))
	add("update: 9 statements", cat([]byte{0x89}, bytes.Repeat(bstrOf(list), 9)))
	add("update: text statement", cat([]byte{0x81}, hd(3, uint64(len(cert))), cert))
	whole := trustUpdate(cert, list)
	cs = append(cs, damaged(whole, 11, 13, 40)...)
	cs = append(cs, epochCases(cert, list)...)
	return sortedCases(cs)
}

// epochStatement is the root's epoch statement of payload p.
func epochStatement(signer string, p []byte) []byte {
	return statement(signer, auth.ContentEpoch, p).bytes()
}

// epochPayload is auth.Epoch{n, issued} in deterministic CBOR.
func epochPayload(n uint64) []byte { return cat(hd(5, 2), u(1), u(n), u(2), u(1700000000000)) }

// epochCases: epoch statements alone, with others, in their slot (a newer
// one wins, an older one in the same update refused alone), every field
// rule of the payload, forgeries, the content types crossed, the size
// limit, truncations and mutations.
func epochCases(cert, list []byte) []decodeCase {
	var cs []decodeCase
	add := func(name string, in []byte) { cs = append(cs, decodeCase{"epoch: " + name, in}) }
	pay := func(name string, p []byte) { add(name, trustUpdate(epochStatement("operator", p))) }
	e3, e2 := epochStatement("operator", epochPayload(3)), epochStatement("operator", epochPayload(2))
	add("3", trustUpdate(e3))
	add("with a certificate and a list", trustUpdate(cert, list, e3))
	add("3, then 2 (older, refused alone)", trustUpdate(e3, e2))
	add("2, then 3", trustUpdate(e2, e3))
	add("3 twice", trustUpdate(e3, e3))
	pay("1", epochPayload(1))
	pay("2^64-1", epochPayload(1<<64-1))
	pay("0", epochPayload(0))
	pay("no issued", cat(hd(5, 1), u(1), u(4)))
	pay("no epoch", cat(hd(5, 1), u(2), u(4)))
	pay("empty map", hd(5, 0))
	pay("epoch null", cat(hd(5, 2), u(1), []byte{0xf6}, u(2), u(1)))
	pay("issued null", cat(hd(5, 2), u(1), u(5), u(2), []byte{0xf6}))
	pay("issued undefined", cat(hd(5, 2), u(1), u(5), u(2), []byte{0xf7}))
	pay("issued negative", cat(hd(5, 2), u(1), u(5), u(2), neg(7)))
	pay("issued 2^63", cat(hd(5, 2), u(1), u(5), u(2), hd(0, 1<<63)))
	pay("epoch negative", cat(hd(5, 2), u(1), neg(4), u(2), u(1)))
	pay("epoch text", cat(hd(5, 2), u(1), tstr("5"), u(2), u(1)))
	pay("epoch float", cat(hd(5, 2), u(1), []byte{0xf9, 0x45, 0x00}, u(2), u(1)))
	pay("epoch tagged", cat(hd(5, 2), u(1), []byte{0xc1}, u(5), u(2), u(1)))
	pay("epoch in 9 bytes", cat(hd(5, 2), u(1), hw(0, 27, 5), u(2), u(1)))
	pay("heads one size longer", cat(hw(5, 24, 2), hw(0, 24, 1), hw(0, 24, 5), hw(0, 24, 2), hw(0, 26, 1700000000)))
	pay("keys in another order", cat(hd(5, 2), u(2), u(1), u(1), u(6)))
	pay("epoch twice", cat(hd(5, 2), u(1), u(5), u(1), u(6)))
	pay("unknown field 3", cat(hd(5, 3), u(1), u(5), u(2), u(1), u(3), u(0)))
	pay("text key", cat(hd(5, 1), tstr("1"), u(5)))
	pay("an array", cat(hd(4, 2), u(5), u(1)))
	pay("null", []byte{0xf6})
	pay("trailing byte", append(epochPayload(5), 0))
	pay("indefinite map", cat([]byte{0xbf}, u(1), u(5), []byte{0xff}))
	add("signed by gw-a", trustUpdate(epochStatement("gw-a", epochPayload(9))))
	forged := statement("operator", auth.ContentEpoch, epochPayload(9))
	forged.signer = "gw-a"
	add("gw-a's signature, the root's kid", trustUpdate(forged.bytes()))
	add("under the certificate's content type", trustUpdate(statement("operator", auth.ContentCertificate, epochPayload(4)).bytes()))
	add("under the list's content type", trustUpdate(statement("operator", auth.ContentRevocations, epochPayload(4)).bytes()))
	add("a list under the epoch's content type", trustUpdate(statement("operator", auth.ContentEpoch, revPayload(4)).bytes()))
	for _, n := range []int{auth.MaxEpochSize, auth.MaxEpochSize + 1} { // padded with an unknown field: refused as such, or as too large first
		for pad := 0; pad < n; pad++ {
			if b := epochStatement("operator", cat(hd(5, 3), epochPayload(6)[1:], u(3), tstr(strings.Repeat("p", pad)))); len(b) == n {
				add(fmt.Sprintf("statement of %d bytes", n), trustUpdate(b))
				break
			}
		}
	}
	for _, c := range damaged(trustUpdate(e3), 7, 29, 30) {
		add(c.name, c.in)
	}
	return cs
}

// goTakes is the Go side's verdict on an update, as auth.Ledger.Learn
// decides it: every statement parsed and the root's, or the update refused
// whole; taken, the newer statements adopted in order, and the fleet epoch
// the trust then holds.
func goTakes(raw []byte) (bool, uint64) {
	root := findKey("operator")
	tr, err := auth.NewTrust([]byte(root.kid), &root.priv.PublicKey, func() time.Time { return time.Unix(1800000000, 0) })
	if err != nil {
		panic(err)
	}
	stmts, err := auth.ParseUpdate(raw)
	if err != nil {
		return false, 0
	}
	var news []*auth.Statement
	for _, s := range stmts {
		st, err := tr.Check(s)
		switch {
		case err == nil:
			news = append(news, st)
		case !errors.Is(err, auth.ErrStaleTrust):
			return false, 0
		}
	}
	for _, st := range news {
		_ = tr.Adopt(st) // something newer adopted first: refused alone
	}
	return true, tr.Epoch()
}

func generateTrustVectors() ([]byte, error) {
	var w hdr
	w.blobs.WriteString(`/* Code generated by TestTrustVectorsCurrent (go generate ./devices/firmware/...); DO NOT EDIT.
 *
 * Trust updates decided by the Go side (auth.ParseUpdate, Trust.Check of
 * every statement): ok is 1 if Go takes the update, epoch the fleet epoch
 * it then holds (Trust.Epoch). The root is
 * efs_troot (kid, uncompressed P-256 point). A blob is pre, then fill_n
 * bytes of fill, then post.
 */
#ifndef EFS_TRUST_VECTORS_H
#define EFS_TRUST_VECTORS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	const uint8_t *pre;
	size_t pre_n;
	uint8_t fill;
	size_t fill_n;
	const uint8_t *post;
	size_t post_n;
} efs_tblob;

typedef struct {
	const char *name;
	efs_tblob in;
	int ok;
	uint64_t epoch; /* taken: the fleet epoch the trust then holds */
} efs_tupdate;

`)
	var rows []string
	for _, c := range trustCorpus() {
		ok, epoch := goTakes(c.in)
		rows = append(rows, fmt.Sprintf("\t{%s, %s, %d, %dull},\n", cstr(c.name), w.blob(c.in), b2i(ok), epoch))
	}
	w.table("efs_tupdate", "efs_tupdates", rows)
	root := findKey("operator")
	pt, err := root.priv.PublicKey.Bytes()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&w.tables, "static const char efs_troot_kid[] = %s;\nstatic const uint8_t *const efs_troot_point = %s;\n",
		cstr(root.kid), w.bytesVar(pt))
	out := strings.ReplaceAll(string(w.finish()), "efs_vblob", "efs_tblob")
	return []byte(out), nil
}

// TestTrustConformance builds test/trust_host.c with efsdev's trust.c
// (ASan, UBSan, warnings as errors; Debian's mbedTLS) and runs every trust
// vector: C takes what Go takes and refuses what Go refuses.
func TestTrustConformance(t *testing.T) {
	compiler := cc(t)
	if _, err := os.Stat("/usr/include/mbedtls/ecdsa.h"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no mbedTLS headers (libmbedtls-dev): run make deps")
		}
		t.Skip("no mbedTLS headers (libmbedtls-dev); under CI=true this fails")
	}
	bin := filepath.Join(t.TempDir(), "trust_host")
	args := []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1",
		"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Iinclude", "-Ilinux", "-o", bin,
		"test/trust_host.c", "linux/trust.c"}
	args = append(args, librarySources(t)...)
	run(t, 2*time.Minute, compiler, append(args, "-lmbedcrypto")...)
	out := run(t, 2*time.Minute, bin)
	t.Log(strings.TrimSpace(out[strings.LastIndexByte(strings.TrimSpace(out), '\n')+1:]))
}

// trustNulls: every field of a certificate and of a revocation list null,
// and undefined for one, as auth's decoder reads them (a field left
// empty): what Go then takes or refuses, C must too.
func trustNulls() []decodeCase {
	pt, err := findKey("gw-a").priv.PublicKey.Bytes()
	if err != nil {
		panic(err)
	}
	null := []byte{0xf6}
	cert := [][]byte{bstr("gw-a"), cat(hd(5, 4), u(1), u(2), neg(0), u(1), neg(1), bstrOf(pt[1:33]), neg(2), bstrOf(pt[33:])),
		cat(hd(4, 1), tstr("dev-a")), hd(0, 1700000000), hd(0, 4000000000), u(1), u(0)}
	list := [][]byte{u(2), cat(hd(4, 1), bstr("gw-x")), hd(0, 1700000000)}
	build := func(fields [][]byte, at int, v []byte) []byte {
		b := hd(5, uint64(len(fields)))
		for i, f := range fields {
			if i == at {
				f = v
			}
			b = cat(b, u(uint64(i+1)), f)
		}
		return b
	}
	var cs []decodeCase
	for i := range cert {
		p := build(cert, i, null)
		cs = append(cs, decodeCase{fmt.Sprintf("certificate: field %d null", i+1),
			trustUpdate(statement("operator", auth.ContentCertificate, p).bytes())})
	}
	cs = append(cs, decodeCase{"certificate: field 7 undefined", trustUpdate(statement("operator",
		auth.ContentCertificate, build(cert, 6, []byte{0xf7})).bytes())})
	for i := range list {
		cs = append(cs, decodeCase{fmt.Sprintf("revocation list: field %d null", i+1),
			trustUpdate(statement("operator", auth.ContentRevocations, build(list, i, null)).bytes())})
	}
	return cs
}
