package fwjob

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// noteWire is what NoteHistory reads of a step's body; other fields are
// skipped.
type noteWire struct {
	Job   *string `cbor:"job"`
	Image []byte  `cbor:"image"`
}

// NoteHistory is a shim.Options.HistoryNote: it writes the job of a
// firmware step into its history event (Event.Job), and for fw.begin the
// image's SHA-256 in hex (Event.Image), so that a checker tells one job's
// steps at a device from another's (at most one image activated per job
// per device). Other kinds, and a body without a valid job id, add nothing.
func NoteHistory(env *fence.Envelope, e *history.Event) {
	if !IsKind(env.Kind) || len(env.Body) == 0 {
		return
	}
	var w noteWire
	if cbor.Unmarshal(env.Body, &w) != nil {
		return
	}
	job, err := jobID(w.Job)
	if err != nil {
		return
	}
	e.Job = job
	if env.Kind == KindBegin && len(w.Image) == sha256.Size {
		e.Image = hex.EncodeToString(w.Image)
	}
}
