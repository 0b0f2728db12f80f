package shim_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
)

// valve is a device: it accepts "open" and "close" and prints what it does.
type valve struct{}

func (valve) Check(env *fence.Envelope) error {
	if env.Kind != "open" && env.Kind != "close" {
		return fmt.Errorf("valve cannot %q", env.Kind)
	}
	return nil
}

func (valve) Apply(env *fence.Envelope) error {
	fmt.Printf("  valve: %s (token %d seq %d)\n", env.Kind, env.Token, env.Seq)
	return nil
}

func ExampleShim_Handle() {
	dir, err := os.MkdirTemp("", "shim-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	s, err := shim.Open(filepath.Join(dir, "fence.db"), nil)
	if err != nil {
		panic(err)
	}
	defer s.Close()

	send := func(who string, token fence.Token, seq uint64, kind string) {
		raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "valve-3",
			Token: token, Seq: seq, ID: fmt.Sprintf("%s-%d", who, seq), Kind: kind, Holder: who})
		if err != nil {
			panic(err)
		}
		// "valve-3" is the device the message was addressed to (its topic).
		ack := s.Handle("valve-3", raw, valve{})
		fmt.Printf("%s %d/%d %s: %v, mark %v\n", who, token, seq, kind, ack.Verdict, ack.Mark())
	}
	send("gw-a", 41, 1, "open")
	send("gw-b", 42, 1, "close") // gw-a was paused; its lease passed to gw-b
	send("gw-a", 41, 2, "open")  // gw-a wakes up: refused
	send("gw-b", 42, 1, "close") // redelivered: acknowledged, not re-applied
	send("gw-b", 42, 2, "flood")

	// Output:
	//   valve: open (token 41 seq 1)
	// gw-a 41/1 open: accepted, mark 41/1
	//   valve: close (token 42 seq 1)
	// gw-b 42/1 close: accepted, mark 42/1
	// gw-a 41/2 open: stale, mark 42/1
	// gw-b 42/1 close: duplicate, mark 42/1
	// gw-b 42/2 flood: invalid, mark 42/1
}
