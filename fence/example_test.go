package fence_test

import (
	"errors"
	"fmt"

	"github.com/edgefence/edgefence/fence"
)

// The timeline of the fencing-token argument, at one fence point: holder A
// is granted the lease at etcd revision 7 and writes; A pauses, its lease
// expires and B is granted it at revision 9; A wakes up and writes with its
// old token; the broker redelivers one of B's commands.
func ExampleAdmit() {
	var m fence.Mark // a fresh fence point
	for _, c := range []struct {
		who string
		tok fence.Token
		seq uint64
	}{
		{"A", 7, 1}, // A holds the lease
		{"B", 9, 1}, // A is paused; its lease expired; B holds it
		{"A", 7, 2}, // A wakes up, unaware
		{"B", 9, 1}, // redelivered (QoS 1)
		{"B", 9, 2},
	} {
		var v fence.Verdict
		v, m = fence.Admit(m, c.tok, c.seq)
		fmt.Printf("%s token %d seq %d: %-9s mark %v\n", c.who, c.tok, c.seq, v, m)
	}
	// Output:
	// A token 7 seq 1: accepted  mark 7/1
	// B token 9 seq 1: accepted  mark 9/1
	// A token 7 seq 2: stale     mark 9/1
	// B token 9 seq 1: duplicate mark 9/1
	// B token 9 seq 2: accepted  mark 9/2
}

func ExampleMarshalEnvelope() {
	body, err := fence.EncodeBody(map[string]any{"relay": true})
	if err != nil {
		panic(err)
	}
	env := &fence.Envelope{V: fence.Version, Device: "pump-07", Token: 9, Seq: 1, ID: "c-1", Kind: "set", Body: body}
	b, err := fence.MarshalEnvelope(env)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d bytes: %x\n", len(b), b)
	// Output:
	// 35 bytes: a70101026770756d702d3037030904010563632d31066373657407a16572656c6179f5
}

func ExampleUnmarshalEnvelope() {
	b := []byte("\xa7\x01\x01\x02\x67pump-07\x03\x09\x04\x01\x05\x63c-1\x06\x63set\x07\xa1\x65relay\xf5")
	env, err := fence.UnmarshalEnvelope(b)
	if err != nil {
		panic(err)
	}
	var set struct {
		Relay bool `cbor:"relay"`
	}
	if err := fence.DecodeBody(env.Body, &set); err != nil {
		panic(err)
	}
	fmt.Printf("device %s token %d seq %d kind %s relay=%v\n", env.Device, env.Token, env.Seq, env.Kind, set.Relay)

	// Anything malformed is refused with ErrInvalid, to be answered with an
	// Invalid ack.
	_, err = fence.UnmarshalEnvelope(b[:len(b)-1])
	fmt.Println(errors.Is(err, fence.ErrInvalid))
	// Output:
	// device pump-07 token 9 seq 1 kind set relay=true
	// true
}

// A fence point's whole decision, and the agent reading the answer.
func ExampleNewAck() {
	mark := fence.Mark{Token: 9, Seq: 4} // loaded from durable storage

	// Fence point: decode, decide, (persist the mark if accepted), answer.
	in, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "pump-07", Token: 7, Seq: 2, ID: "c-8", Kind: "set"})
	env, err := fence.UnmarshalEnvelope(in)
	if err != nil {
		panic(err)
	}
	v, after := fence.Admit(mark, env.Token, env.Seq)
	ack := fence.NewAck(env, v, after, "newer holder at token 9")
	out, err := fence.MarshalAck(&ack)
	if err != nil {
		panic(err)
	}

	// Agent: record the terminal state.
	got, err := fence.UnmarshalAck(out)
	if err != nil {
		panic(err)
	}
	err = got.Err()
	fmt.Println(got.ID, got.Verdict, got.Mark(), errors.Is(err, fence.ErrStale))
	fmt.Println(err)
	// Output:
	// c-8 stale 9/4 true
	// fence: stale token: newer holder at token 9
}

func ExampleVerdict_Err() {
	for _, v := range []fence.Verdict{fence.Accepted, fence.Duplicate, fence.Stale, fence.Invalid, fence.Expired} {
		fmt.Printf("%-9v %v\n", v, v.Err())
	}
	// Output:
	// accepted  <nil>
	// duplicate fence: duplicate command
	// stale     fence: stale token
	// invalid   fence: invalid envelope
	// expired   fence: command expired
}
