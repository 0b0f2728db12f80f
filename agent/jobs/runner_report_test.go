package jobs

import (
	"strings"
	"testing"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/shadow"
)

// reportCases are parseReport's table, and the fuzz seeds (as CBOR, the
// way reports arrive).
var reportCases = []struct {
	name string
	in   map[string]any
	want fwReport
	err  string
}{
	{"as fwjob reports it", fwjob.Status{Job: "j1", State: fwjob.Downloading, Bytes: 4096, Size: 9000, Slot: "a", Security: 2, Token: 7}.Report(),
		fwReport{Job: "j1", State: fwjob.Downloading, Bytes: 4096, Size: 9000, Slot: "a", Version: 2, Token: 7}, ""},
	{"as it arrives (numbers float64)", map[string]any{"job": "j1", "state": "installed", "bytes": 9000.0, "size": 9000.0, "image": "ab"},
		fwReport{Job: "j1", State: fwjob.Installed, Bytes: 9000, Size: 9000, Image: "ab"}, ""},
	{"idle, only the state", map[string]any{"state": "idle"}, fwReport{State: fwjob.Idle}, ""},
	{"no state", map[string]any{"job": "j1"}, fwReport{}, `state ""`},
	{"unknown state", map[string]any{"state": "flashing"}, fwReport{}, `state "flashing"`},
	{"state not text", map[string]any{"state": 3.0}, fwReport{}, "state is float64"},
	{"negative bytes", map[string]any{"state": "downloading", "bytes": -1.0}, fwReport{}, "bytes is -1"},
	{"fractional size", map[string]any{"state": "downloading", "size": 1.5}, fwReport{}, "size is 1.5"},
	{"bytes beyond size", map[string]any{"state": "downloading", "bytes": 10.0, "size": 5.0}, fwReport{}, "10 bytes of 5"},
	{"token as text", map[string]any{"state": "idle", "token": "7"}, fwReport{}, "token is string"},
}

func TestParseReport(t *testing.T) {
	for _, c := range reportCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseReport(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// FuzzParseReport: any state report's "fw" field parses or is refused
// with an error; never a panic, and a parsed one is consistent.
func FuzzParseReport(f *testing.F) {
	for _, c := range reportCases {
		b, err := shadow.EncodeCBOR(map[string]any{"fw": c.in}, shadow.Limits{})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := shadow.DecodeCBOR(b, shadow.Limits{})
		if err != nil {
			return
		}
		fw, ok := m["fw"].(map[string]any)
		if !ok {
			return
		}
		p, err := parseReport(fw)
		if err == nil && p.State.InProgress() && p.Bytes > p.Size {
			t.Fatalf("parsed %+v: bytes beyond size", p)
		}
	})
}
