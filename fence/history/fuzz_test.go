package history_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/edgefence/edgefence/fence/history"
)

// FuzzRead: Read (Decode) never panics on any file content; it either returns
// events (which Check takes without panicking) or an ErrCorrupt error, and
// the events it returns, written back with anything appended after the last
// newline, read back as those events.
func FuzzRead(f *testing.F) {
	var seed []byte
	for _, e := range clean() {
		b, _ := json.Marshal(e)
		seed = append(append(seed, b...), '\n')
	}
	f.Add(seed, []byte(`{"t":"2026-11-29T12:00:00Z","op":"verd`))
	f.Add([]byte("not json\n"), []byte("{"))
	f.Add([]byte("\n\n"), []byte(""))
	f.Add([]byte(`{"op":"opened"}`+"\n"), []byte(`{"op":1}`))
	f.Fuzz(func(t *testing.T, body, tail []byte) {
		evs, err := history.Decode(bytes.NewReader(body), "h.jsonl")
		if err != nil && !errors.Is(err, history.ErrCorrupt) {
			t.Fatalf("not ErrCorrupt: %v", err)
		}
		_ = history.Check(evs).String()
		if err != nil {
			return
		}
		// The events written back, then a torn tail: the same events, plus
		// at most the tail if it happens to parse.
		var intact []byte
		for _, e := range evs {
			b, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			intact = append(append(intact, b...), '\n')
		}
		again, err := history.Decode(bytes.NewReader(append(intact, withoutNewline(tail)...)), "h.jsonl")
		if err != nil {
			t.Fatalf("with a torn tail %q: %v", tail, err)
		}
		if len(again) < len(evs) || len(again) > len(evs)+1 {
			t.Fatalf("%d events, then %d with tail %q", len(evs), len(again), tail)
		}
	})
}

func withoutNewline(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c != '\n' {
			out = append(out, c)
		}
	}
	return out
}
