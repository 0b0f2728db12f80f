package serial

import (
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPortConfigValidate(t *testing.T) {
	ok := PortConfig{Path: "/dev/ttyUSB0"}
	for _, tc := range []struct {
		name  string
		cfg   PortConfig
		field string // "" means valid
	}{
		{"defaults", ok, ""},
		{"all set", PortConfig{Path: "/dev/ttyS0", Baud: 9600, DataBits: 7, Parity: "E", StopBits: 2, ReadTimeout: 2500 * time.Millisecond}, ""},
		{"odd parity", PortConfig{Path: "x", Parity: "O"}, ""},
		{"max timeout", PortConfig{Path: "x", ReadTimeout: 25500 * time.Millisecond}, ""},
		{"no path", PortConfig{}, "Path"},
		{"baud", PortConfig{Path: "x", Baud: 12345}, "Baud"},
		{"negative baud", PortConfig{Path: "x", Baud: -1}, "Baud"},
		{"data bits 4", PortConfig{Path: "x", DataBits: 4}, "DataBits"},
		{"data bits 9", PortConfig{Path: "x", DataBits: 9}, "DataBits"},
		{"parity mark", PortConfig{Path: "x", Parity: "M"}, "Parity"},
		{"parity lower case", PortConfig{Path: "x", Parity: "n"}, "Parity"},
		{"stop bits 3", PortConfig{Path: "x", StopBits: 3}, "StopBits"},
		{"timeout too short", PortConfig{Path: "x", ReadTimeout: 50 * time.Millisecond}, "ReadTimeout"},
		{"timeout not tenths", PortConfig{Path: "x", ReadTimeout: 150 * time.Millisecond}, "ReadTimeout"},
		{"timeout too long", PortConfig{Path: "x", ReadTimeout: 26 * time.Second}, "ReadTimeout"},
		{"negative timeout", PortConfig{Path: "x", ReadTimeout: -time.Second}, "ReadTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate error = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	got, err := ok.withDefaults()
	want := PortConfig{Path: ok.Path, Baud: 115200, DataBits: 8, Parity: "N", StopBits: 1, ReadTimeout: 100 * time.Millisecond}
	if err != nil || got != want {
		t.Fatalf("withDefaults = %+v, %v; want %+v", got, err, want)
	}
}

func TestOpenPortMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ttyUSB0")
	_, err := OpenPort(PortConfig{Path: path})
	if !errors.Is(err, ErrPortMissing) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenPort error = %v, want ErrPortMissing and fs.ErrNotExist", err)
	}
	var pe *PortError
	if !errors.As(err, &pe) || pe.Path != path || pe.Op != "open" {
		t.Fatalf("error %v: want a *PortError for open %s", err, path)
	}
	if want := "serial: open " + path + ": port missing: no such file or directory"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
}

func TestOpenPortBusy(t *testing.T) {
	a := newAdapter(t)
	a.Plug()
	p, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	_, err = OpenPort(PortConfig{Path: a.Path})
	if !errors.Is(err, ErrPortBusy) {
		t.Fatalf("second OpenPort error = %v, want ErrPortBusy", err)
	}
	p.Close()
	p2, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatalf("OpenPort after Close: %v", err)
	}
	p2.Close()
}

func TestPortReadWrite(t *testing.T) {
	a := newAdapter(t)
	m := a.Plug()
	p, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Nothing sent: tarm's (0, io.EOF) becomes ErrReadTimeout.
	buf := make([]byte, 64)
	if n, err := p.Read(buf); n != 0 || !errors.Is(err, ErrReadTimeout) || errors.Is(err, io.EOF) {
		t.Fatalf("idle Read = %d, %v; want ErrReadTimeout", n, err)
	}
	// Raw mode both ways: no echo, no CR/LF translation.
	msg := []byte("a\r\nb\x00\x03\x11\x13")
	if _, err := m.Write(msg); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, p, len(msg)); string(got) != string(msg) {
		t.Fatalf("port read %q, want %q", got, msg)
	}
	if _, err := p.Write(msg); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, m, len(msg)); string(got) != string(msg) {
		t.Fatalf("master read %q, want %q", got, msg)
	}
}

// readN reads n bytes, skipping timeouts.
func readN(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, n)
	deadline := time.Now().Add(testDeadline)
	for len(got) < n && time.Now().Before(deadline) {
		k, err := r.Read(buf[:n-len(got)])
		got = append(got, buf[:k]...)
		if err != nil && !errors.Is(err, ErrReadTimeout) {
			t.Fatalf("read: %v", err)
		}
	}
	return got
}

// TestPortHangup: when the adapter goes away the tty is hung up and tarm
// returns (0, io.EOF) at once, forever, which looks like a timeout; Read
// must report ErrPortGone instead.
func TestPortHangup(t *testing.T) {
	a := newAdapter(t)
	a.Plug()
	p, err := OpenPort(PortConfig{Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a.Unplug()
	buf := make([]byte, 16)
	_, err = p.Read(buf)
	if !errors.Is(err, ErrPortGone) {
		t.Fatalf("Read after hangup = %v, want ErrPortGone", err)
	}
	if _, err := p.Write([]byte("x")); !errors.Is(err, ErrPortGone) {
		t.Fatalf("Write after hangup = %v, want ErrPortGone", err)
	}
}

// TestPortCloseDuringRead: Close while another goroutine is blocked in
// Read returns, and so does the Read (tarm's Close would hang with
// ReadTimeout 0; we never use 0 and Close waits for the Read).
func TestPortCloseDuringRead(t *testing.T) {
	a := newAdapter(t)
	a.Plug()
	p, err := OpenPort(PortConfig{Path: a.Path, ReadTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	reading := make(chan struct{})
	go func() {
		buf := make([]byte, 16)
		close(reading)
		for {
			if _, err := p.Read(buf); err != nil && !errors.Is(err, ErrReadTimeout) {
				readErr <- err
				return
			}
		}
	}()
	<-reading
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(testDeadline):
		t.Fatal("Close hung")
	}
	select {
	case err := <-readErr:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Read after Close = %v, want ErrClosed", err)
		}
	case <-time.After(testDeadline):
		t.Fatal("Read did not return after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
