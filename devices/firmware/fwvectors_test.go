package firmware

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

const fwVectorsPath = "testdata/fw_vectors.h"

// The device the firmware vectors run on, in Go and in C (test/fw_host.c):
// slot a holds fwFactory at security version fwSecurity; images are at
// most fwMaxImage bytes (the C port's slot size); three trial boots.
const (
	fwDevice   = "fw-1"
	fwFactory  = "factory image"
	fwSecurity = 2
	fwMaxImage = 2048
)

// TestFwVectorsCurrent regenerates the firmware job vectors from the Go
// devices/fwjob and fails if the checked-in header differs (go generate
// ./devices/firmware/...); TestFirmwareJobHost runs them against the C
// state machine.
func TestFwVectorsCurrent(t *testing.T) {
	checkGenerated(t, fwVectorsPath, func() ([]byte, error) { return generateFwVectors(t.TempDir()) })
}

// fwAction is one action of a scenario: a command (kind and body from a
// holder's token and seq), or a reboot with the health check's verdict.
type fwAction struct {
	boot    bool
	healthy bool
	token   fence.Token
	seq     uint64
	kind    string
	body    any
	epoch   uint64 // the command's
	raw     []byte // sent as it is (an operator's reset), in place of an envelope
}

type fwScenario struct {
	name    string
	actions []fwAction
	// manifests: the device holds the operator's root (Config.Manifests);
	// other: it runs fwApp beside the firmware (Config.Other).
	manifests, other bool
}

func fwImage(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>3)
	}
	return b
}

// fwScript numbers a holder's commands.
type fwScript struct {
	acts  []fwAction
	token fence.Token
	seq   uint64
}

func (s *fwScript) cmd(kind string, body any) *fwScript {
	s.seq++
	s.acts = append(s.acts, fwAction{token: s.token, seq: s.seq, kind: kind, body: body})
	return s
}

func (s *fwScript) job(kind, job string) *fwScript { return s.cmd(kind, fwjob.JobBody{Job: job}) }

func (s *fwScript) boot(healthy bool) *fwScript {
	s.acts = append(s.acts, fwAction{boot: true, healthy: healthy})
	return s
}

// download begins job with img (hash of want, security version v) and
// sends it in chunks of n.
func (s *fwScript) download(job string, img []byte, want []byte, v uint64, n int) *fwScript {
	s.cmd(fwjob.KindBegin, fwjob.BeginBody{Job: job, Image: want, Size: uint64(len(img)), Version: v, Chunk: uint64(n)})
	for off := 0; off < len(img); off += n {
		s.cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: job, Off: uint64(off), Data: img[off:min(off+n, len(img))]})
	}
	return s
}

func fwScenarios() []fwScenario {
	img := fwImage(1000)
	sum := sha256.Sum256(img)
	bad := sum
	bad[0] ^= 1
	s := func() *fwScript { return &fwScript{token: 7} }
	var out []fwScenario
	add := func(name string, sc *fwScript) { out = append(out, fwScenario{name: name, actions: sc.acts}) }

	happy := s().download("j1", img, sum[:], 3, 256).job(fwjob.KindInstall, "j1").job(fwjob.KindActivate, "j1").
		boot(true).job(fwjob.KindCommit, "j1").boot(true)
	happy.acts = append(happy.acts, happy.acts[len(happy.acts)-2]) // the commit again: duplicate
	happy.acts = append(happy.acts, fwAction{token: 5, seq: 99, kind: fwjob.KindCancel, body: fwjob.JobBody{Job: "j1"}})
	add("job begin to commit, a duplicate, a deposed holder", happy)

	ill := s().job(fwjob.KindInstall, "j1").
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 1, Chunk: 256}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 2, Chunk: 256}).
		job(fwjob.KindInstall, "j1").job(fwjob.KindActivate, "j1").job(fwjob.KindCommit, "j1").
		cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 10, Data: img[:10]}).
		cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 0, Data: img[:257]}).
		cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 0, Data: img[:256]}).
		cmd(fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 0, Data: img[:256]}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j2", Image: sum[:], Size: 1000, Version: 3, Chunk: 256}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 3, Chunk: 256}).
		job(fwjob.KindCommit, "j2").job(fwjob.KindCancel, "j1").job(fwjob.KindInstall, "j1").job(fwjob.KindCancel, "j1").
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 3, Chunk: 256})
	add("illegal steps, another job, anti-rollback, wrong offsets", ill)

	add("bad hash at the last chunk, then a new job", s().download("j1", img, bad[:], 3, 300).
		job(fwjob.KindInstall, "j1").download("j2", img, sum[:], 3, 1000).job(fwjob.KindInstall, "j2"))

	add("cancel downloading", s().cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 3,
		Chunk: 256}).job(fwjob.KindCancel, "j1").boot(true))
	add("cancel downloaded", s().download("j1", img, sum[:], 3, 512).job(fwjob.KindCancel, "j1").boot(true))
	add("cancel installed", s().download("j1", img, sum[:], 3, 512).job(fwjob.KindInstall, "j1").
		job(fwjob.KindCancel, "j1").boot(true).job(fwjob.KindActivate, "j1"))
	add("cancel rebooting", s().download("j1", img, sum[:], 3, 512).job(fwjob.KindInstall, "j1").
		job(fwjob.KindActivate, "j1").job(fwjob.KindCancel, "j1").boot(true))
	add("cancel confirming, a begin before the reboot", s().download("j1", img, sum[:], 3, 512).
		job(fwjob.KindInstall, "j1").job(fwjob.KindActivate, "j1").boot(true).job(fwjob.KindCancel, "j1").
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j2", Image: sum[:], Size: 1000, Version: 3, Chunk: 512}).
		boot(true).job(fwjob.KindCommit, "j1"))
	add("unhealthy trial boot, then the job again", s().download("j1", img, sum[:], 3, 512).
		job(fwjob.KindInstall, "j1").job(fwjob.KindActivate, "j1").boot(false).boot(true).
		download("j2", img, sum[:], 3, 512).job(fwjob.KindInstall, "j2").job(fwjob.KindActivate, "j2").boot(true).
		job(fwjob.KindCommit, "j2"))
	add("bad bodies", s().cmd(fwjob.KindBegin, map[string]any{"job": "j1", "image": sum[:], "version": 3, "chunk": 1}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:31], Size: 1000, Version: 3, Chunk: 256}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: fwMaxImage + 1, Version: 3, Chunk: 256}).
		cmd(fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: 1000, Version: 3, Chunk: 0}).
		cmd(fwjob.KindBegin, map[string]any{"job": "j1", "image": sum[:], "size": 1, "version": 3, "chunk": 1, "x": 1}).
		cmd(fwjob.KindChunk, map[string]any{"job": "j1", "data": []byte{1}}).
		cmd(fwjob.KindChunk, map[string]any{"job": "j1", "off": 0, "data": []byte{}}).
		cmd(fwjob.KindInstall, map[string]any{}).
		cmd(fwjob.KindInstall, fwjob.JobBody{Job: strings.Repeat("j", 65)}).
		cmd(fwjob.KindInstall, fwjob.JobBody{Job: "j\x01"}).
		cmd(fwjob.KindInstall, map[string]any{"job": 1}).
		cmd(fwjob.KindInstall, []any{"j1"}).
		cmd(fwjob.KindInstall, nil).
		cmd("fw.reboot", fwjob.JobBody{Job: "j1"}).
		cmd("set", map[string]any{"setpoint": 20}))
	return append(out, fwManifestScenarios(img)...)
}

// fwDeviceRig is the Go device the vectors run on.
type fwDeviceRig struct {
	sc      fwScenario
	dir     string
	s       *shim.Shim
	d       *fwjob.Device
	healthy bool
}

func (r *fwDeviceRig) start() (fwjob.BootInfo, error) {
	info, err := fwjob.Boot(context.Background(), r.dir, fwjob.BootConfig{Security: fwSecurity,
		Health: func(context.Context, fwjob.BootInfo) error {
			if !r.healthy {
				return errors.New("app did not come up")
			}
			return nil
		}})
	if err != nil {
		return info, err
	}
	var opts *shim.Options
	cfg := fwjob.Config{Dir: r.dir, Device: fwDevice, MaxImage: fwMaxImage}
	if r.sc.other {
		cfg.Other = fwApp{}
	}
	if r.sc.manifests { // the root: the manifests' and the resets' (C: one root hook)
		rk, err := fwRootKey()
		if err != nil {
			return info, err
		}
		cfg.Manifests, opts = rk, &shim.Options{Root: rk}
	}
	if r.s, err = shim.Open(fwjob.DBPath(r.dir), opts); err != nil {
		return info, err
	}
	r.d, err = fwjob.New(cfg)
	return info, err
}

// fwClass is the sentinel a refusal's reason starts with (efs_fw_err).
func fwClass(reason string) int {
	reason = strings.TrimPrefix(strings.TrimPrefix(reason, "check: "), "apply: ") // devices/shim's prefixes
	for i, e := range []error{fwjob.ErrCommand, fwjob.ErrState, fwjob.ErrBusy, fwjob.ErrRollback, fwjob.ErrManifest,
		fwjob.ErrOffset, fwjob.ErrStorage} {
		if strings.HasPrefix(reason, e.Error()) {
			return i + 1
		}
	}
	return 0
}

var fwStates = map[fwjob.State]int{}

func init() {
	for i, s := range fwjob.States {
		fwStates[s] = i
	}
}

func fwSlot(s string) int { return map[string]int{"a": 0, "b": 1, "": 255}[s] }

func fwEnvelope(a fwAction) ([]byte, error) {
	var body cbor.RawMessage
	if a.body != nil {
		b, err := fence.EncodeBody(a.body)
		if err != nil {
			return nil, err
		}
		body = b
	}
	return fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: fwDevice, Token: a.token, Seq: a.seq,
		ID: fmt.Sprintf("c-%d-%d", a.token, a.seq), Kind: a.kind, Body: body, Holder: fmt.Sprintf("gw-%d", a.token),
		Epoch: a.epoch})
}

// fwRun runs one scenario on a fresh Go device in dir and returns its rows.
func (w *hdr) fwRun(dir string, sc fwScenario) (string, error) {
	if err := os.WriteFile(fwjob.SlotPath(dir, fwjob.SlotA), []byte(fwFactory), 0o600); err != nil {
		return "", err
	}
	r := &fwDeviceRig{sc: sc, dir: dir, healthy: true}
	if _, err := r.start(); err != nil {
		return "", err
	}
	defer func() { r.s.Close() }()
	var rows []string
	for i, a := range sc.actions {
		var in []byte
		var ack fence.Ack
		var st fwjob.Status
		trial := 0
		if a.boot {
			if err := r.s.Close(); err != nil {
				return "", err
			}
			r.healthy = a.healthy
			info, err := r.start()
			if err != nil {
				return "", fmt.Errorf("%s: action %d: %w", sc.name, i, err)
			}
			st = info.Status
			if info.Trial {
				trial = 1
			}
		} else if a.raw != nil {
			in = a.raw
			o := r.d.Handle(r.s, in)
			ack, st = o.Ack, o.Status
		} else {
			var err error
			if in, err = fwEnvelope(a); err != nil {
				return "", fmt.Errorf("%s: action %d: %w", sc.name, i, err)
			}
			o := r.d.Handle(r.s, in)
			ack, st = o.Ack, o.Status
		}
		healthy := 0
		if a.healthy {
			healthy = 1
		}
		rows = append(rows, fmt.Sprintf("\t{%d, %d, %s, %d, %d, %dull, %dull, %dull, %d, %s, %s, %d, %dull, %d, %d, %dull, %d, %dull},\n",
			b2i(a.boot), healthy, w.cbytesLen(in), ack.Verdict, fwClass(ack.Reason), ack.Epoch, ack.MaxToken, ack.LastSeq,
			len(ack.Reason), cstr(ack.Reason), cstr(st.Reason), fwStates[st.State], st.Bytes, fwSlot(st.Slot),
			fwSlot(st.Active), st.Security, trial, st.Seq))
	}
	name := fmt.Sprintf("efs_fwv%d", w.n+1)
	w.n++
	fmt.Fprintf(&w.tables, "static const efs_fwvstep %s[] = {\n%s};\n\n", name, strings.Join(rows, ""))
	return fmt.Sprintf("\t{%s, %s, %d, %d, %d},\n", cstr(sc.name), name, len(rows), b2i(sc.manifests), b2i(sc.other)), nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cbytesLen is "bytes, n" for a C initializer.
func (w *hdr) cbytesLen(b []byte) string { return fmt.Sprintf("%s, %d", w.bytesVar(b), len(b)) }

const fwPreamble = `/* Code generated by TestFwVectorsCurrent (go generate ./devices/firmware/...); DO NOT EDIT.
 *
 * Firmware job scenarios run through the Go devices/fwjob (a fresh device
 * per scenario: slot a holds EFS_FWV_FACTORY at security EFS_FWV_SECURITY,
 * images of at most EFS_FWV_MAX_IMAGE bytes): per action, a command's
 * envelope or a reboot with the health check's verdict, and what Go
 * answered (verdict, mark, the refusal's class and reason) and the
 * firmware state after it.
 */
#ifndef EFS_FW_VECTORS_H
#define EFS_FW_VECTORS_H

#include <stddef.h>
#include <stdint.h>

#define EFS_FWV_DEVICE "%s"
#define EFS_FWV_FACTORY "%s"
#define EFS_FWV_SECURITY %d
#define EFS_FWV_MAX_IMAGE %d
/* The operator's root (Config.Manifests): kid, P-256 point uncompressed. */
#define EFS_FWV_ROOT_KID "%s"
#define EFS_FWV_ROOT_POINT ((const uint8_t *)%s)

typedef struct {
	int boot, healthy; /* a reboot (no command), and the health verdict */
	const uint8_t *in;
	size_t in_n;
	int verdict, cls; /* cls: efs_fw_err of a refused step, 0 otherwise */
	uint64_t epoch, mark_token, mark_seq; /* the ack's state */
	size_t reason_n;
	const char *reason;     /* the ack's */
	const char *job_reason; /* the job's (Status.Reason) */
	int state;
	uint64_t bytes;
	int running, active;
	uint64_t security;
	int trial;
	uint64_t seq; /* of the job's last step */
} efs_fwvstep;

typedef struct {
	uint8_t d[32], sig[64]; /* a Sig_structure's digest, a signature the root made over it */
} efs_fwvdigest;

typedef struct {
	const char *name;
	const efs_fwvstep *steps;
	size_t n;
	int manifests, other; /* the device holds the root; it runs the application (app.set) */
} efs_fwvscenario;

`

func generateFwVectors(dir string) ([]byte, error) {
	var w hdr
	fmt.Fprintf(&w.blobs, fwPreamble, fwDevice, fwFactory, fwSecurity, fwMaxImage, fwRootKid, cbytes(fwRootPoint()))
	var rows []string
	scs := fwScenarios()
	for i, sc := range scs {
		d := filepath.Join(dir, fmt.Sprint(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
		row, err := w.fwRun(d, sc)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	w.table("efs_fwvscenario", "efs_fwvscenarios", rows)
	w.rootVerifiedTable(scs)
	return []byte(w.blobs.String() + w.tables.String() + "#endif\n"), nil
}
