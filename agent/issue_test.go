package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// lossySender loses fw.chunk deliveries on purpose: of every four chunk
// sends, the first never reaches the broker and the third reaches the
// device but its ack is lost. The worker resends both as the same
// envelope.
type lossySender struct {
	Sender
	n              atomic.Int32
	dropped, noAck atomic.Int32
}

var errLost = errors.New("lost on purpose")

func (s *lossySender) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	if env.Kind != fwjob.KindChunk {
		return s.Sender.Send(ctx, env)
	}
	switch s.n.Add(1) % 4 {
	case 1:
		s.dropped.Add(1)
		return nil, errLost
	case 3:
		if _, err := s.Sender.Send(ctx, env); err != nil {
			return nil, err
		}
		s.noAck.Add(1)
		return nil, errLost
	}
	return s.Sender.Send(ctx, env)
}

// encode encodes a firmware body.
func encode(t testing.TB, b interface {
	Encode() (cbor.RawMessage, error)
}) []byte {
	t.Helper()
	raw, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// issueChunks issues every chunk of data for job without waiting.
func issueChunks(t *testing.T, a *testAgent, dev, job string, data []byte, chunk int) []*Pending {
	t.Helper()
	var ps []*Pending
	for off := 0; off < len(data); off += chunk {
		body := fwjob.ChunkBody{Job: job, Off: uint64(off), Data: data[off:min(off+chunk, len(data))]}
		p, err := a.Issue(context.Background(), dev, fwjob.KindChunk, encode(t, body))
		if err != nil {
			t.Fatalf("issue at %d: %v", off, err)
		}
		t.Cleanup(p.Close)
		ps = append(ps, p)
	}
	return ps
}

// beginJob sends fw.begin of img's bytes for job and returns them.
func beginJob(t *testing.T, w *fwWorld, a *testAgent, dev, job string, tag string, size int) []byte {
	t.Helper()
	img := w.image(tag, size, 1)
	sum, err := img.Hash()
	if err != nil {
		t.Fatal(err)
	}
	b := fwjob.BeginBody{Job: job, Image: sum, Size: img.Size, Version: img.Version, Chunk: uint64(w.chunk)}
	if ack, err := a.Send(context.Background(), dev, fwjob.KindBegin, encode(t, b)); err != nil {
		t.Fatalf("fw.begin: %+v %v", ack, err)
	}
	w.images.mu.Lock()
	defer w.images.mu.Unlock()
	return w.images.m[img.SHA256]
}

// TestIssueKeepsOrderUnderResends: a whole image's chunks are issued at
// once, without waiting, through a sender that loses a quarter of them
// before the broker and a quarter of their acks: the device's worker
// resends each as the same envelope, the device gets every chunk at its
// offset (it refuses any other), each applied once, and every Pending
// ends accepted (or duplicate: the resend of a chunk whose ack was lost),
// in the order issued; fw.install then verifies the slot's SHA-256.
func TestIssueKeepsOrderUnderResends(t *testing.T) {
	w := newFWWorld(t)
	w.noJobs, w.chunk = true, 1<<10
	d := w.device("fw-order", fwjob.BootConfig{})
	var lossy *lossySender
	a, _ := w.agent("gw-1", []string{d.id}, func(s Sender) Sender { lossy = &lossySender{Sender: s}; return lossy })
	waitLong(t, "the agent holds the device", func() bool { _, ok := a.Holding(d.id); return ok })
	data := beginJob(t, w, a, d.id, "j-order", "in-order", 24<<10+100)

	ps := issueChunks(t, a, d.id, "j-order", data, w.chunk)
	var dup int
	for i, p := range ps {
		ack, err := p.Wait(context.Background())
		if ack == nil || (ack.Verdict != fence.Accepted && ack.Verdict != fence.Duplicate) {
			t.Fatalf("chunk %d (seq %d): %+v %v", i, p.Envelope.Seq, ack, err)
		}
		if ack.Verdict == fence.Duplicate {
			dup++
		}
	}
	if lossy.dropped.Load() == 0 || lossy.noAck.Load() == 0 || dup == 0 {
		t.Fatalf("no loss exercised: dropped %d, acks lost %d, duplicates %d", lossy.dropped.Load(), lossy.noAck.Load(), dup)
	}
	if ack, err := a.Send(context.Background(), d.id, fwjob.KindInstall, encode(t, fwjob.JobBody{Job: "j-order"})); err != nil {
		t.Fatalf("fw.install: %+v %v", ack, err)
	}
	if st := d.status(); st.State != fwjob.Installed || st.Bytes != uint64(len(data)) {
		t.Fatalf("device %+v", st)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.twice) != 0 || len(d.chunks) != len(ps) {
		t.Fatalf("chunks applied %d (want %d), twice %v", len(d.chunks), len(ps), d.twice)
	}
}

// TestIssueStaleEndsTheRest: a holder issues a window of chunks; the first
// is frozen in its send while the holder loses its lease and the other
// gateway writes the first chunk under its token. Released, the frozen
// chunk is refused stale, and every chunk issued behind it ends stale too
// (at the agent, never sent, or refused at the device): none of the old
// holder's chunks lands.
func TestIssueStaleEndsTheRest(t *testing.T) {
	w := newFWWorld(t)
	w.noJobs, w.chunk = true, 1<<10
	d := w.device("fw-depose", fwjob.BootConfig{})
	devs := []string{d.id}
	var gate *chunkGate
	a, _ := w.agent("gw-a", devs, func(s Sender) Sender { gate = newChunkGate(t, s, 1); return gate })
	waitFor(t, "gw-a holds", holdingAll(a, devs))
	b, _ := w.agent("gw-b", devs, nil)
	data := beginJob(t, w, a, d.id, "j-depose", "depose", 8<<10)
	ps := issueChunks(t, a, d.id, "j-depose", data, w.chunk)
	wait(t, "gw-a's first chunk held", gate.held)

	revokeSession(t, a)
	waitLong(t, "gw-b holds", holdingAll(b, devs))
	tb, _ := b.Holding(d.id)
	first := fwjob.ChunkBody{Job: "j-depose", Off: 0, Data: data[:w.chunk]}
	if ack, err := b.Send(context.Background(), d.id, fwjob.KindChunk, encode(t, first)); err != nil {
		t.Fatalf("gw-b's chunk: %+v %v", ack, err)
	}
	close(gate.release)
	for i, p := range ps {
		ack, err := p.Wait(context.Background())
		if !errors.Is(err, fence.ErrStale) || ack.Verdict != fence.Stale {
			t.Fatalf("gw-a's chunk %d: %+v %v", i, ack, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.chunks) != 1 || d.chunks["j-depose/0"] != tb {
		t.Fatalf("chunks applied: %v; want only gw-b's at 0 under token %d", d.chunks, tb)
	}
	if st := fmt.Sprint(a.Holding(d.id)); st != "0 false" {
		t.Fatalf("gw-a still holds: %s", st)
	}
}

// holdFirst is a Sender that holds its first Send until release closes.
type holdFirst struct {
	Sender
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdFirst) Send(ctx context.Context, env *fence.Envelope) (*fence.Ack, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.held)
		<-h.release
	}
	return h.Sender.Send(ctx, env)
}

// TestDeliveryRecordsVerdictWhileSendingNext: the outbox's record of a
// verdict (its fsync) is off the device's path: while the commit of the
// first command's verdict is held, the device's worker already delivers
// the second. Its waiter still gets the ack only once it is recorded: in
// strict mode (outbox.verdict_delay 0), today's ordering.
func TestDeliveryRecordsVerdictWhileSendingNext(t *testing.T) {
	ob, err := offline.Open(filepath.Join(t.TempDir(), offline.File), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	fp := newFencePoint()
	s := &holdFirst{Sender: fp, held: make(chan struct{}), release: make(chan struct{})}
	cfg := &Config{Gateway: "gw", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 5 * time.Second},
		Outbox: OutboxConfig{VerdictDelay: new(time.Duration(0))}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthOff}}}
	histPath := filepath.Join(t.TempDir(), "history.jsonl")
	hist, err := history.Create(histPath, "gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hist.Close() })
	a := runAgent(t, cfg, etcdClient(t), s, Options{Outbox: ob, History: hist})
	waitFor(t, "a holds d1", holdingAll(a, []string{"d1"}))
	ctx := context.Background()
	p1, err := a.Issue(ctx, "d1", "set", []byte{0xa0})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, "the first command at the device", s.held)
	p2, err := a.Issue(ctx, "d1", "set", []byte{0xa0})
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	inCommit, unblock := make(chan struct{}), make(chan struct{})
	var once, unblocked sync.Once
	release := func() { unblocked.Do(func() { close(unblock) }) }
	t.Cleanup(release) // a failed test lets the commit go, so that the agent stops
	ob.ObserveCommits(func(time.Duration) {
		if armed.Load() {
			once.Do(func() { close(inCommit); <-unblock })
		}
	})
	armed.Store(true)
	close(s.release)
	wait(t, "the first verdict's commit", inCommit)
	waitLong(t, "the second command at the device while the first verdict is recorded", func() bool {
		fp.mu.Lock()
		defer fp.mu.Unlock()
		return len(fp.applied["d1"]) == 2
	})
	if len(p1.ch) != 0 {
		t.Fatal("the first command's waiter has its ack before the outbox recorded it")
	}
	// Nor its terminal event in the history: a kill -9 now leaves the
	// command pending, resent and ended once, as a duplicate.
	if n := terminals(t, histPath, p1.Envelope.ID); n != 0 {
		t.Fatalf("the history has %d terminal events of the first command before the outbox recorded it", n)
	}
	release()
	for i, p := range []*Pending{p1, p2} {
		if ack, err := p.Wait(ctx); err != nil || ack.Verdict != fence.Accepted {
			t.Fatalf("command %d: %+v %v", i+1, ack, err)
		}
		if r, err := ob.Get(p.Envelope.ID); err != nil || r.Pending() {
			t.Fatalf("command %d not recorded terminal: %+v %v", i+1, r, err)
		}
		waitLong(t, "the command's terminal event in the history", func() bool { return terminals(t, histPath, p.Envelope.ID) == 1 })
	}
}

// terminals counts the terminal events of command id in the history at path.
func terminals(t *testing.T, path, id string) int {
	t.Helper()
	evs, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Op == history.OpTerminal && e.ID == id {
			n++
		}
	}
	return n
}
