package sim_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/devices/sim"
)

func TestFirmwareImage(t *testing.T) {
	a, err := sim.FirmwareImage(4096, sim.HealthMarker+sim.HealthFail, sim.VersionMarker+"1.2.3-rc.1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sim.FirmwareImage(4096, sim.HealthMarker+sim.HealthFail, sim.VersionMarker+"1.2.3-rc.1")
	c, _ := sim.FirmwareImage(4096, sim.VersionMarker+"1.2.3-rc.1")
	switch {
	case len(a) != 4096 || !bytes.Equal(a, b):
		t.Fatalf("not deterministic: %d bytes", len(a))
	case bytes.Equal(a[100:], c[100:]):
		t.Fatal("other markers, same filler")
	}
	if m := sim.ParseMarkers(a); m != (sim.ImageMarkers{Health: sim.HealthFail, Version: "1.2.3-rc.1"}) {
		t.Fatalf("markers %+v", m)
	}
	if m := sim.ParseMarkers(c); m.Health != "" {
		t.Fatalf("markers %+v", m)
	}
	if _, err := sim.FirmwareImage(10, sim.VersionMarker+"1.2.3"); err == nil {
		t.Fatal("markers longer than the image: no error")
	}
	if _, err := sim.FirmwareImage(0); err == nil {
		t.Fatal("empty image: no error")
	}
}

func TestParseMarkers(t *testing.T) {
	long := strings.Repeat("v", sim.MaxMarkerValue+10)
	for _, tt := range []struct {
		image string
		want  sim.ImageMarkers
	}{
		{"", sim.ImageMarkers{}},
		{"EDGEFENCE-HEALTH=hang\x00rest", sim.ImageMarkers{Health: "hang"}},
		{"xxEDGEFENCE-VERSION=2.0 EDGEFENCE-HEALTH=crash", sim.ImageMarkers{Health: "crash", Version: "2.0"}},
		{"EDGEFENCE-HEALTH=ok EDGEFENCE-HEALTH=fail", sim.ImageMarkers{Health: "ok"}}, // the first counts
		{"EDGEFENCE-VERSION=" + long, sim.ImageMarkers{Version: long[:sim.MaxMarkerValue]}},
		{"EDGEFENCE-VERSION=\xff\xfe", sim.ImageMarkers{}},
		{"EDGEFENCE-HEALTH", sim.ImageMarkers{}},
	} {
		if got := sim.ParseMarkers([]byte(tt.image)); got != tt.want {
			t.Errorf("ParseMarkers(%q) = %+v, want %+v", tt.image, got, tt.want)
		}
	}
}

func FuzzParseMarkers(f *testing.F) {
	f.Add([]byte("EDGEFENCE-HEALTH=fail\nEDGEFENCE-VERSION=1.0\n"))
	f.Add([]byte("EDGEFENCE-VERSION=\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := sim.ParseMarkers(b)
		for _, v := range []string{m.Health, m.Version} {
			if len(v) > sim.MaxMarkerValue || !utf8.ValidString(v) || strings.ContainsAny(v, " \n\x00=") {
				t.Fatalf("marker value %q", v)
			}
		}
	})
}

// TestImageHealth: the booted image decides its health check.
func TestImageHealth(t *testing.T) {
	dir := t.TempDir()
	check := func(markers ...string) (lost bool, err error) {
		img, err := sim.FirmwareImage(1000, markers...)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "slot")
		if err := os.WriteFile(p, img, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err = sim.ImageHealth(func() { lost = true })(ctx, fwjob.BootInfo{Path: p})
		return lost, err
	}
	if lost, err := check(sim.VersionMarker + "1"); err != nil || lost {
		t.Fatalf("no health marker: %v %v", err, lost)
	}
	if _, err := check(sim.HealthMarker + sim.HealthFail); !errors.Is(err, sim.ErrUnhealthy) {
		t.Fatalf("fail: %v", err)
	}
	if lost, err := check(sim.HealthMarker + sim.HealthHang); err != nil || lost {
		t.Fatalf("hang: %v %v (Boot tells a hang by the window's end)", err, lost)
	}
	if lost, _ := check(sim.HealthMarker + sim.HealthCrash); !lost {
		t.Fatal("crash: no power loss")
	}
	if err := sim.ImageHealth(nil)(context.Background(), fwjob.BootInfo{Path: filepath.Join(dir, "none")}); err == nil {
		t.Fatal("unreadable image passed")
	}
}
