package jobs

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func validJob() Job {
	return Job{ID: "fw-1", Image: ImageRef{SHA256: strings.Repeat("ab", 32), Size: 1000, Version: 2, URL: "file:///srv/fw.bin"},
		Targets: Targets{Devices: []string{"dev-1"}, Match: []string{"fw-*"}}}
}

func TestJobValidate(t *testing.T) {
	j := validJob()
	j.ApplyDefaults()
	if err := j.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(*Job){
		"id":      func(j *Job) { j.ID = "a/b" },
		"long id": func(j *Job) { j.ID = strings.Repeat("x", MaxJobIDLen+1) },
		"sha":     func(j *Job) { j.Image.SHA256 = "abc" },
		"size":    func(j *Job) { j.Image.Size = 0 },
		"url":     func(j *Job) { j.Image.URL = "" },
		"chunk":   func(j *Job) { j.Chunk = 1 << 20 },
		"targets": func(j *Job) { j.Targets = Targets{} },
		"device":  func(j *Job) { j.Targets.Devices = []string{"a b"} },
		"pattern": func(j *Job) { j.Targets.Match = []string{"["} },
		"ratio":   func(j *Job) { j.Rollout.Abort.FailureRatio = 1.5 },
		"limit":   func(j *Job) { j.Rollout.MaxConcurrent = -1 },
		"timeout": func(j *Job) { j.Timeout.Step = -1 },
	}
	for name, f := range bad {
		j := validJob()
		f(&j)
		if err := j.Validate(); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("%s: %v, want ErrInvalidJob", name, err)
		}
	}
}

func TestJobSelects(t *testing.T) {
	j := validJob()
	for id, want := range map[string]bool{"dev-1": true, "fw-9": true, "dev-2": false, "xfw-1": false} {
		if j.Selects(id) != want {
			t.Errorf("Selects(%q) = %v", id, !want)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	var to Timeouts
	if err := json.Unmarshal([]byte(`{"step":"90s","reboot":5000000000}`), &to); err != nil {
		t.Fatal(err)
	}
	if time.Duration(to.Step) != 90*time.Second || time.Duration(to.Reboot) != 5*time.Second {
		t.Fatalf("%+v", to)
	}
	b, _ := json.Marshal(to)
	if !strings.Contains(string(b), `"step":"1m30s"`) {
		t.Fatalf("%s", b)
	}
	if err := json.Unmarshal([]byte(`{"step":"soon"}`), &to); err == nil {
		t.Fatal("bad duration accepted")
	}
}
