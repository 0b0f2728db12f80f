package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// benchImage is the image size of BenchmarkFirmwareTransfer: 64 chunks.
const benchImage = 1 << 20

// BenchmarkFirmwareTransfer: image bytes per second into a device's slot
// with 16 KiB chunks, through a real agent, etcd, broker and an in-process
// fwjob device. "runner": one whole job per iteration (begin, 64 chunks,
// install, activate with the device's reboot, commit, the execution's
// fenced writes); "raw": the bare command path the runner uses, Agent.Send
// of fw.begin and the 64 chunks in a loop (outbox, MQTT, the fence), then
// fw.cancel. MB/s is over the whole iteration; chunkMB/s over the chunk
// phase as the device saw it (its first to its last fw.chunk applied),
// the figure the issue compares (≥ 0.8× the raw path).
func BenchmarkFirmwareTransfer(b *testing.B) {
	b.Run("runner", func(b *testing.B) {
		benchTransfer(b, false, func(w *fwWorld, d *fwDev, _ *testAgent, job string, img jobs.ImageRef) {
			w.createJob(job, img, d.id)
			if e := w.waitEnded(d.id, job); e.Status != jobs.Succeeded {
				b.Fatalf("%+v", e)
			}
		})
	})
	b.Run("raw", func(b *testing.B) {
		benchTransfer(b, true, func(w *fwWorld, d *fwDev, a *testAgent, job string, img jobs.ImageRef) {
			rawTransfer(b, w, a, d.id, job, img)
		})
	})
}

// benchTransfer runs b.N transfers of a fresh image each to one device.
func benchTransfer(b *testing.B, raw bool, transfer func(w *fwWorld, d *fwDev, a *testAgent, job string, img jobs.ImageRef)) {
	w, d, a := benchFirmwareWorld(b, raw)
	b.SetBytes(benchImage)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		img := w.image(fmt.Sprintf("img-%d-", i), benchImage, 1)
		b.StartTimer()
		transfer(w, d, a, fmt.Sprintf("bench-%d", i), img)
	}
	b.StopTimer()
	reportChunkRate(b, d)
}

func benchFirmwareWorld(b *testing.B, raw bool) (*fwWorld, *fwDev, *testAgent) {
	w := newFWWorld(b)
	w.chunk, w.noJobs = 16<<10, raw
	d := w.device("fw-bench", fwjob.BootConfig{})
	a, _ := w.agent("gw-bench", []string{d.id}, nil)
	waitLong(b, "the agent holds the device", func() bool { _, ok := a.Holding(d.id); return ok })
	return w, d, a
}

// rawTransfer sends fw.begin and every chunk of img with Agent.Send, then
// fw.cancel (so that the next begin is allowed).
func rawTransfer(b *testing.B, w *fwWorld, a *testAgent, dev, job string, img jobs.ImageRef) {
	ctx := context.Background()
	w.images.mu.Lock()
	data := w.images.m[img.SHA256]
	w.images.mu.Unlock()
	sum, err := img.Hash()
	if err != nil {
		b.Fatal(err)
	}
	send := func(kind string, body interface {
		Encode() (cbor.RawMessage, error)
	}) {
		raw, err := body.Encode()
		if err != nil {
			b.Fatal(err)
		}
		if ack, err := a.Send(ctx, dev, kind, raw); err != nil || ack.Verdict != fence.Accepted {
			b.Fatalf("%s: %+v %v", kind, ack, err)
		}
	}
	send(fwjob.KindBegin, fwjob.BeginBody{Job: job, Image: sum, Size: img.Size, Version: img.Version, Chunk: uint64(w.chunk)})
	for off := 0; off < len(data); off += w.chunk {
		send(fwjob.KindChunk, fwjob.ChunkBody{Job: job, Off: uint64(off), Data: data[off:min(off+w.chunk, len(data))]})
	}
	send(fwjob.KindCancel, fwjob.JobBody{Job: job})
}

// reportChunkRate reports the device's chunk phase in MB/s over every
// job it ran.
func reportChunkRate(b *testing.B, d *fwDev) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var span time.Duration
	for _, sp := range d.spans {
		span += sp[1].Sub(sp[0])
	}
	if span > 0 {
		b.ReportMetric(float64(len(d.spans))*benchImage/span.Seconds()/1e6, "chunkMB/s")
	}
}
