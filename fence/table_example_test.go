package fence_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgefence/edgefence/fence"
)

// The gateway's fence table in front of a device that cannot check tokens:
// every command passes Admit, and only an Accepted one goes to the wire,
// after Admit returned (the new mark is on disk by then). The table keeps
// its marks across a restart of the gateway.
func ExampleTable() {
	dir, err := os.MkdirTemp("", "fence-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, fence.TableFile)

	tab, err := fence.OpenTable(path, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	send := func(tab *fence.Table, holder string, tok fence.Token, seq uint64) {
		env := &fence.Envelope{V: fence.Version, Device: "plc-3", Token: tok, Seq: seq,
			ID: fmt.Sprintf("%s-%d", holder, seq), Kind: "write", Holder: holder}
		v, mark, err := tab.Admit(ctx, env)
		if err != nil {
			fmt.Println("no decision:", err) // do not send; answer Invalid
			return
		}
		wire := "not sent"
		if v == fence.Accepted {
			wire = "sent to the device"
		}
		fmt.Printf("%s token %d seq %d: %-9s mark %v, %s\n", holder, tok, seq, v, mark, wire)
	}
	send(tab, "gw-a", 7, 1) // A holds the lease
	send(tab, "gw-b", 9, 1) // A paused past its TTL; B holds the lease now
	tab.Close()             // the gateway restarts

	tab, err = fence.OpenTable(path, nil)
	if err != nil {
		panic(err)
	}
	defer tab.Close()
	send(tab, "gw-a", 7, 2) // A wakes up, unaware
	send(tab, "gw-b", 9, 1) // redelivered
	send(tab, "gw-b", 9, 2)

	r, _, err := tab.Get("plc-3")
	if err != nil {
		panic(err)
	}
	fmt.Printf("stored: %s at %v, set by %s with command %s\n", r.Device, r.Mark, r.Holder, r.ID)
	// Output:
	// gw-a token 7 seq 1: accepted  mark 7/1, sent to the device
	// gw-b token 9 seq 1: accepted  mark 9/1, sent to the device
	// gw-a token 7 seq 2: stale     mark 9/1, not sent
	// gw-b token 9 seq 1: duplicate mark 9/1, not sent
	// gw-b token 9 seq 2: accepted  mark 9/2, sent to the device
	// stored: plc-3 at 9/2, set by gw-b with command gw-b-2
}
