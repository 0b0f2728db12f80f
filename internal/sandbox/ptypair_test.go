package sandbox

import (
	"bytes"
	"io"
	"os"
	"testing"
)

func TestPtyPair(t *testing.T) {
	p, err := NewPtyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := os.OpenFile(p.A, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.OpenFile(p.B, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msg := []byte{0x00, 0x01, 0x0a, 0x0d, 0x03, 0xff, 0x00} // raw: nothing translated
	if _, err := a.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(b, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("got % x, %v", got, err)
	}
	if _, err := b.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 4)
	if _, err := io.ReadFull(a, got); err != nil || string(got) != "pong" {
		t.Fatalf("got %q, %v", got, err)
	}
}
