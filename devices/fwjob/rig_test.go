package fwjob_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

const dev = "fw-1"

// rig is one firmware device: its directory, fence point and Device, and
// a holder that numbers its commands.
type rig struct {
	t     testing.TB
	dir   string
	cfg   fwjob.Config
	boot  fwjob.BootConfig
	s     *shim.Shim
	d     *fwjob.Device
	token fence.Token
	seq   uint64
	last  fwjob.BootInfo
}

// newRig boots a fresh device in a temporary directory (factory image
// "factory" in slot a) and opens its fence point.
func newRig(t testing.TB, boot fwjob.BootConfig) *rig {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(fwjob.SlotPath(dir, fwjob.SlotA), []byte("factory"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: dir, cfg: fwjob.Config{Dir: dir, Device: dev}, boot: boot, token: 10}
	r.start()
	t.Cleanup(func() { r.s.Close() })
	return r
}

// start is the device's start: Boot, then the fence point.
func (r *rig) start() {
	r.t.Helper()
	info, err := fwjob.Boot(context.Background(), r.dir, r.boot)
	if err != nil {
		r.t.Fatalf("boot: %v", err)
	}
	r.last = info
	if r.s, err = shim.Open(fwjob.DBPath(r.dir), nil); err != nil {
		r.t.Fatal(err)
	}
	if r.d, err = fwjob.New(r.cfg); err != nil {
		r.t.Fatal(err)
	}
}

// reboot closes the fence point and starts again.
func (r *rig) reboot() fwjob.BootInfo {
	r.t.Helper()
	if err := r.s.Close(); err != nil {
		r.t.Fatal(err)
	}
	r.start()
	return r.last
}

// env encodes a command of the current holder (next seq).
func (r *rig) env(kind string, body any) []byte {
	r.t.Helper()
	r.seq++
	return envelope(r.t, r.token, r.seq, kind, body)
}

func envelope(t testing.TB, token fence.Token, seq uint64, kind string, body any) []byte {
	t.Helper()
	raw, err := encode(token, seq, kind, body)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func encode(token fence.Token, seq uint64, kind string, body any) ([]byte, error) {
	b, err := fence.EncodeBody(body)
	if err != nil {
		return nil, err
	}
	return fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: token, Seq: seq,
		ID: fmt.Sprintf("c-%d-%d", token, seq), Kind: kind, Body: cbor.RawMessage(b), Holder: fmt.Sprintf("gw-%d", token)})
}

// send handles one command of the current holder.
func (r *rig) send(kind string, body any) fwjob.Outcome {
	r.t.Helper()
	return r.d.Handle(r.s, r.env(kind, body))
}

// must sends a command that must be accepted and returns the state after.
func (r *rig) must(kind string, body any) fwjob.Status {
	r.t.Helper()
	o := r.send(kind, body)
	if o.Ack.Verdict != fence.Accepted {
		r.t.Fatalf("%s: %v %q", kind, o.Ack.Verdict, o.Ack.Reason)
	}
	return o.Status
}

// refused sends a command that must be Invalid with a reason containing
// want, and checks that neither the mark nor the firmware state moved.
func (r *rig) refused(kind string, body any, want string) {
	r.t.Helper()
	before, mark := r.status(), r.mark()
	o := r.send(kind, body)
	if o.Ack.Verdict != fence.Invalid || !strings.Contains(o.Ack.Reason, want) {
		r.t.Fatalf("%s: %v %q, want invalid with %q", kind, o.Ack.Verdict, o.Ack.Reason, want)
	}
	if after := r.status(); fmt.Sprint(after) != fmt.Sprint(before) || r.mark() != mark {
		r.t.Fatalf("%s refused but moved: %+v → %+v (mark %v → %v)", kind, before, after, mark, r.mark())
	}
}

func (r *rig) status() fwjob.Status {
	r.t.Helper()
	s, err := r.d.Status(r.s)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

func (r *rig) mark() fence.Mark {
	r.t.Helper()
	m, err := r.s.Mark(dev)
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// image is a job's image: n deterministic pseudo-random bytes.
type image struct {
	job     string
	data    []byte
	version uint64
	chunk   int
}

func newImage(job string, n int, version uint64, chunk int) image {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(len(job))+version))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return image{job: job, data: data, version: version, chunk: chunk}
}

func (im image) sum() []byte { s := sha256.Sum256(im.data); return s[:] }

func (im image) begin() fwjob.BeginBody {
	return fwjob.BeginBody{Job: im.job, Image: im.sum(), Size: uint64(len(im.data)), Version: im.version, Chunk: uint64(im.chunk)}
}

// chunkAt is the chunk of im starting at off.
func (im image) chunkAt(off uint64) fwjob.ChunkBody {
	end := min(off+uint64(im.chunk), uint64(len(im.data)))
	return fwjob.ChunkBody{Job: im.job, Off: off, Data: im.data[off:end]}
}

func (im image) job1() fwjob.JobBody { return fwjob.JobBody{Job: im.job} }

// download sends every chunk from the device's reported offset.
func (r *rig) download(im image) fwjob.Status {
	r.t.Helper()
	st := r.status()
	for st.State == fwjob.Downloading {
		st = r.must(fwjob.KindChunk, im.chunkAt(st.Bytes))
	}
	return st
}

// slot returns the content of a slot file.
func (r *rig) slot(s string) []byte {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.dir, "slot-"+s))
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}
