package fwjob_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// noteCases are NoteHistory's table, and FuzzNoteHistory's seeds.
var noteCases = []struct {
	name, kind string
	body       any
	job, image string
}{
	{"begin", fwjob.KindBegin, fwjob.BeginBody{Job: "j1", Image: sum("x"), Size: 1, Version: 2, Chunk: 1}, "j1", hex.EncodeToString(sum("x"))},
	{"chunk", fwjob.KindChunk, fwjob.ChunkBody{Job: "j1", Off: 4, Data: []byte("data")}, "j1", ""},
	{"activate", fwjob.KindActivate, fwjob.JobBody{Job: "j2"}, "j2", ""},
	{"begin, short image", fwjob.KindBegin, map[string]any{"job": "j3", "image": []byte{1}}, "j3", ""},
	{"image on another kind", fwjob.KindCommit, map[string]any{"job": "j4", "image": sum("x")}, "j4", ""},
	{"unknown fw kind", "fw.bogus", fwjob.JobBody{Job: "j5"}, "j5", ""},
	{"not a firmware kind", "set", fwjob.JobBody{Job: "j6"}, "", ""},
	{"no job", fwjob.KindInstall, map[string]any{"off": 1}, "", ""},
	{"job not text", fwjob.KindInstall, map[string]any{"job": 7}, "", ""},
	{"job with a control character", fwjob.KindInstall, fwjob.JobBody{Job: "j\n7"}, "", ""},
	{"job too long", fwjob.KindInstall, fwjob.JobBody{Job: strings.Repeat("j", fwjob.MaxJobLen+1)}, "", ""},
	{"body not a map", fwjob.KindInstall, []byte{1, 2}, "", ""},
}

func sum(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// TestNoteHistory: a firmware step's history event names its job, and
// fw.begin's its image; anything else adds nothing.
func TestNoteHistory(t *testing.T) {
	for _, tt := range noteCases {
		t.Run(tt.name, func(t *testing.T) {
			b, err := fence.EncodeBody(tt.body)
			if err != nil {
				t.Fatal(err)
			}
			var e history.Event
			fwjob.NoteHistory(&fence.Envelope{Kind: tt.kind, Body: b}, &e)
			if e.Job != tt.job || e.Image != tt.image {
				t.Fatalf("job %q image %q, want %q %q", e.Job, e.Image, tt.job, tt.image)
			}
		})
	}
}

// FuzzNoteHistory: any body of any kind: no panic, and a job named only
// if it is a valid job id.
func FuzzNoteHistory(f *testing.F) {
	for _, tt := range noteCases {
		b, err := fence.EncodeBody(tt.body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(tt.kind, []byte(b))
	}
	f.Fuzz(func(t *testing.T, kind string, body []byte) {
		var e history.Event
		fwjob.NoteHistory(&fence.Envelope{Kind: kind, Body: cbor.RawMessage(body)}, &e)
		if e.Job != "" && (!fwjob.IsKind(kind) || len(e.Job) > fwjob.MaxJobLen) || e.Image != "" && len(e.Image) != 2*sha256.Size {
			t.Fatalf("%s: job %q image %q", kind, e.Job, e.Image)
		}
	})
}
