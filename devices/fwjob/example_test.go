package fwjob_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// encoder is any of the bodies.
type encoder interface {
	Encode() (cbor.RawMessage, error)
}

// A firmware job from begin to commit, the reboot included.
func Example() {
	dir, _ := os.MkdirTemp("", "fwjob-example")
	defer os.RemoveAll(dir)
	img := []byte("firmware v2: a small image")
	sum := sha256.Sum256(img)

	start := func() (*shim.Shim, *fwjob.Device) { // what the device does at power on
		info, _ := fwjob.Boot(context.Background(), dir, fwjob.BootConfig{
			Health: func(context.Context, fwjob.BootInfo) error { return nil }, // the new image's self test
		})
		fmt.Println("boot slot", info.Slot, info.Status.State)
		s, _ := shim.Open(fwjob.DBPath(dir), nil)
		d, _ := fwjob.New(fwjob.Config{Dir: dir, Device: "pump-7"})
		return s, d
	}
	var seq uint64
	send := func(s *shim.Shim, d *fwjob.Device, kind string, body encoder) fwjob.Outcome {
		b, _ := body.Encode()
		seq++
		raw, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "pump-7", Token: 42, Seq: seq,
			ID: fmt.Sprint("cmd-", seq), Kind: kind, Body: b})
		o := d.Handle(s, raw)
		fmt.Println(kind, o.Ack.Verdict, o.Status.State, "reboot:", o.Reboot)
		return o
	}

	s, d := start()
	send(s, d, fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum[:], Size: uint64(len(img)), Version: 2, Chunk: 16})
	send(s, d, fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 0, Data: img[:16]})
	send(s, d, fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 16, Data: img[16:]})
	send(s, d, fwjob.KindInstall, fwjob.JobBody{Job: "j1"})
	send(s, d, fwjob.KindActivate, fwjob.JobBody{Job: "j1"})
	s.Close() // the reboot
	s, d = start()
	o := send(s, d, fwjob.KindCommit, fwjob.JobBody{Job: "j1"})
	fmt.Println(o.Status.Report()["slot"], o.Status.Report()["version"])
	s.Close()
	// Output:
	// boot slot a idle
	// fw.begin accepted downloading reboot: false
	// fw.chunk accepted downloading reboot: false
	// fw.chunk accepted downloaded reboot: false
	// fw.install accepted installed reboot: false
	// fw.activate accepted rebooting reboot: true
	// boot slot b confirming
	// fw.commit accepted committed reboot: false
	// b 2
}
