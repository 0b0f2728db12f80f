package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/edgefence/edgefence/devices/fwjob"
)

// A simulated firmware image is any bytes; what it does when it boots is
// written in it, the way a real image's behaviour is its code. Markers
// (text anywhere in the image, the value running to the first byte that is
// not a letter, digit or one of "._+-", at most MaxMarkerValue bytes):
//
//	EDGEFENCE-HEALTH=fail   its health check fails at once
//	EDGEFENCE-HEALTH=hang   its health check never answers (the window passes)
//	EDGEFENCE-HEALTH=crash  the device dies during the check (power loss:
//	                        FirmwareConfig.PowerLoss)
//	EDGEFENCE-VERSION=TEXT  the version the device reports ("firmware")
//
// Anything else, or no health marker, passes the health check. The first
// occurrence of a marker counts.
const (
	HealthMarker  = "EDGEFENCE-HEALTH="
	VersionMarker = "EDGEFENCE-VERSION="
	// MaxMarkerValue bounds a marker's value (bytes).
	MaxMarkerValue = 64
)

// Health check verdicts an image can carry (HealthMarker's values).
const (
	HealthFail  = "fail"
	HealthHang  = "hang"
	HealthCrash = "crash"
)

// ErrUnhealthy means an image's health check failed (HealthFail).
var ErrUnhealthy = errors.New("sim: image health check failed")

// ImageMarkers are the markers an image carries ("" when absent).
type ImageMarkers struct {
	Health  string
	Version string
}

// ParseMarkers finds the markers in an image.
func ParseMarkers(image []byte) ImageMarkers {
	return ImageMarkers{Health: markerValue(image, HealthMarker), Version: markerValue(image, VersionMarker)}
}

// ReadMarkers reads the image in the file at path and finds its markers.
func ReadMarkers(path string) (ImageMarkers, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ImageMarkers{}, fmt.Errorf("sim: image: %w", err)
	}
	return ParseMarkers(b), nil
}

func markerValue(image []byte, marker string) string {
	i := bytes.Index(image, []byte(marker))
	if i < 0 {
		return ""
	}
	v := image[i+len(marker):]
	n := 0
	for n < len(v) && n < MaxMarkerValue && markerByte(v[n]) {
		n++
	}
	return string(v[:n])
}

func markerByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '+' || c == '-'
}

// FirmwareImage returns a test image of n bytes: the markers (each a whole
// marker with its value, e.g. HealthMarker+HealthFail), each followed by a
// newline, then deterministic filler (a PCG stream seeded from n and the
// markers: the same arguments give the same image, different markers a
// different one). It fails if the markers do not fit in n bytes.
func FirmwareImage(n int, markers ...string) ([]byte, error) {
	var head bytes.Buffer
	for _, m := range markers {
		head.WriteString(m)
		head.WriteByte('\n')
	}
	if n < head.Len() || n <= 0 {
		return nil, fmt.Errorf("sim: image of %d bytes: the markers take %d", n, head.Len())
	}
	seed := sha256.Sum256(head.Bytes())
	rng := rand.New(rand.NewPCG(uint64(n), binary.LittleEndian.Uint64(seed[:8])))
	img := make([]byte, n)
	copy(img, head.Bytes())
	for i := head.Len(); i < n; i++ {
		img[i] = byte(rng.Uint32()) // a marker by chance: 2^-136
	}
	return img, nil
}

// ImageHealth is the health check of a simulated device (fwjob.BootConfig.
// Health): the booted slot's image decides (HealthMarker). powerLoss is
// called for HealthCrash and must not return (it kills the process); nil
// makes such an image hang instead.
func ImageHealth(powerLoss func()) func(ctx context.Context, b fwjob.BootInfo) error {
	return func(ctx context.Context, b fwjob.BootInfo) error {
		m, err := ReadMarkers(b.Path)
		if err != nil {
			return err
		}
		switch m.Health {
		case HealthFail:
			return fmt.Errorf("%w: image marked %s%s", ErrUnhealthy, HealthMarker, HealthFail)
		case HealthCrash:
			if powerLoss != nil {
				powerLoss()
			}
			<-ctx.Done()
		case HealthHang:
			<-ctx.Done() // Boot: "did not pass within" the window
		}
		return nil
	}
}
