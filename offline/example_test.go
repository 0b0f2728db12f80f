package offline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// Example follows one command: appended durably before it is sent,
// delivered in order, resolved with the fence point's ack exactly once.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox")
	defer os.RemoveAll(dir)
	ob, err := offline.Open(filepath.Join(dir, offline.File), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ob.Close()

	e := &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: "pump-1", Token: 42, Seq: 1, ID: "cmd-1", Kind: "set"}}
	if err := ob.Append(context.Background(), e); err != nil {
		fmt.Println(err)
		return
	}
	next, _, _ := ob.Next("pump-1")
	// ... send next.Raw; the fence point answers:
	ack := fence.NewAck(&next.Envelope, fence.Accepted, fence.Mark{Token: 42, Seq: 1}, "")
	fmt.Println(ob.Resolve(next.Envelope.ID, &ack))
	err = ob.Resolve(next.Envelope.ID, &ack)
	fmt.Println(err)
	r, _ := ob.Get("cmd-1")
	fmt.Println(r.Device, r.ID, r.Token, r.StateString())
	// Output:
	// <nil>
	// offline: resolve cmd-1: offline: entry already has a terminal state: accepted
	// pump-1 cmd-1 42 accepted
}
