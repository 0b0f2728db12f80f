package serial_test

import (
	"bytes"
	"fmt"

	"github.com/edgefence/edgefence/transport/serial"
)

// Frames survive noise: the Decoder drops the garbage and the damaged
// frame, and delivers the intact ones. The noise after the last frame is
// not counted yet: no delimiter has ended it.
func ExampleDecoder() {
	var line bytes.Buffer
	for _, p := range []string{"first", "second", "third"} {
		f, _ := serial.Encode([]byte(p))
		if p == "second" {
			f[3] ^= 0x01 // a bit error on the line
		}
		line.Write(f)
		line.WriteString("line noise")
	}
	d, _ := serial.NewDecoder(&line, 0)
	for {
		p, err := d.Next()
		if err != nil {
			break
		}
		fmt.Printf("%s\n", p)
	}
	s := d.Stats()
	fmt.Printf("ok %d, crc errors %d, garbage bytes %d\n", s.FramesOK, s.CRCErrors, s.GarbageBytes)
	// Output:
	// first
	// third
	// ok 2, crc errors 1, garbage bytes 31
}

// The frame for 11 00 22: delimiter, COBS of the payload and its CRC-32C
// (74 01 b2 a7), delimiter.
func ExampleEncode() {
	f, _ := serial.Encode([]byte{0x11, 0x00, 0x22})
	fmt.Printf("% x\n", f)
	// Output:
	// 00 02 11 06 22 74 01 b2 a7 00
}
