package agent

import "testing"

// TestProgressOnly: a download's reports reach the twin a tenth of the
// image at a time; every other change is written.
func TestProgressOnly(t *testing.T) {
	fw := func(state string, bytes, seq uint64) map[string]any {
		return map[string]any{"job": "j", "state": state, "bytes": bytes, "size": uint64(1000), "slot": "a",
			"version": uint64(1), "reason": "", "token": uint64(7), "image": "00", "seq": seq, "boots": uint64(1)}
	}
	rep := func(f map[string]any, temp float64) map[string]any {
		return map[string]any{FieldFirmware: f, "temp": temp}
	}
	prev := rep(fw("downloading", 100, 3), 20)
	for name, tc := range map[string]struct {
		prev, cur map[string]any
		skip      bool
	}{
		"bytes within a tenth":  {prev, rep(fw("downloading", 150, 4), 20), true},
		"bytes a tenth on":      {prev, rep(fw("downloading", 200, 5), 20), false},
		"downloaded":            {prev, rep(fw("downloaded", 1000, 9), 20), false},
		"last bytes":            {prev, rep(fw("downloading", 1000, 9), 20), false},
		"another field changed": {prev, rep(fw("downloading", 150, 4), 21), false},
		"another token":         {prev, func() map[string]any { f := fw("downloading", 150, 4); f["token"] = uint64(9); return rep(f, 20) }(), false},
		"nothing written yet":   {nil, rep(fw("downloading", 150, 4), 20), false},
		"bytes went back":       {prev, rep(fw("downloading", 50, 4), 20), false},
		"not downloading":       {rep(fw("installed", 1000, 3), 20), rep(fw("installed", 1000, 4), 20), false},
		"no fw field":           {map[string]any{"temp": 20.0}, map[string]any{"temp": 20.0}, false},
		"a field added":         {prev, map[string]any{FieldFirmware: fw("downloading", 150, 4), "temp": 20.0, "mode": "x"}, false},
		"bytes not a number":    {prev, rep(map[string]any{"job": "j", "state": "downloading", "bytes": "x", "size": uint64(1000), "slot": "a", "version": uint64(1), "reason": "", "token": uint64(7), "image": "00", "seq": uint64(4), "boots": uint64(1)}, 20), false},
	} {
		if got := progressOnly(tc.prev, tc.cur); got != tc.skip {
			t.Errorf("%s: progressOnly %v, want %v", name, got, tc.skip)
		}
	}
}
