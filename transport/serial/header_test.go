package serial

import (
	"bytes"
	"testing"
)

func TestMessageLayout(t *testing.T) {
	got := appendMessage(nil, header{typ: typeResponse, txid: 0x01020304}, []byte("ok"))
	want := []byte{1, 2, 1, 2, 3, 4, 'o', 'k'}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendMessage = %x, want %x", got, want)
	}
}

// messageCases seed FuzzParseMessage.
var messageCases = []struct {
	name string
	msg  []byte
	ok   bool
}{
	{"request", []byte{1, 1, 0, 0, 0, 7, 'x'}, true},
	{"response, empty body", []byte{1, 2, 0xFF, 0xFF, 0xFF, 0xFF}, true},
	{"short", []byte{1, 1, 0, 0, 0}, false},
	{"empty", []byte{}, false},
	{"version 2", []byte{2, 1, 0, 0, 0, 7}, false},
	{"type 0", []byte{1, 0, 0, 0, 0, 7}, false},
	{"type 3", []byte{1, 3, 0, 0, 0, 7}, false},
}

func TestParseMessage(t *testing.T) {
	for _, tc := range messageCases {
		t.Run(tc.name, func(t *testing.T) {
			h, b, err := parseMessage(tc.msg)
			if (err == nil) != tc.ok {
				t.Fatalf("parseMessage(%x) error = %v, want ok %v", tc.msg, err, tc.ok)
			}
			if err == nil && !bytes.Equal(appendMessage(nil, h, b), tc.msg) {
				t.Fatalf("round trip of %x: %+v %x", tc.msg, h, b)
			}
		})
	}
}

// FuzzParseMessage: arbitrary bytes never panic, and what parses
// re-encodes to the same bytes.
func FuzzParseMessage(f *testing.F) {
	for _, tc := range messageCases {
		f.Add(tc.msg)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, b, err := parseMessage(msg)
		if err == nil && !bytes.Equal(appendMessage(nil, h, b), msg) {
			t.Fatalf("round trip of %x: %+v %x", msg, h, b)
		}
	})
}
