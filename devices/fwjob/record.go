package fwjob

import (
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/fxamacker/cbor/v2"
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// State is a firmware job's state at the device.
type State string

// The job states. Idle: no job yet. Committed, Failed and RolledBack end a
// job; the others are a job in progress.
const (
	Idle        State = "idle"
	Downloading State = "downloading"
	Downloaded  State = "downloaded" // every byte received, SHA-256 verified over them
	Installing  State = "installing" // the device verifies the slot (Device.Settle, or Boot)
	Installed   State = "installed"  // the slot verified: bootable
	Rebooting   State = "rebooting"  // a trial boot of the new slot armed
	Confirming  State = "confirming" // booted the new slot, health check passed
	Committed   State = "committed"
	Failed      State = "failed"
	RolledBack  State = "rolled_back"
)

// States are every job state, in the order a job goes through them.
var States = []State{Idle, Downloading, Downloaded, Installing, Installed, Rebooting, Confirming, Committed, Failed, RolledBack}

// InProgress reports whether a job in state s blocks another job's steps.
func (s State) InProgress() bool {
	return s != Idle && s != Committed && s != Failed && s != RolledBack
}

// Slot names. The files are slot-a and slot-b in the device's directory.
const (
	SlotA = "a"
	SlotB = "b"
)

func otherSlot(s string) string {
	if s == SlotA {
		return SlotB
	}
	return SlotA
}

// recordVersion is the format of the stored record.
const recordVersion = 1

// record is everything the device keeps about firmware, in one bbolt value
// (bucket fwjob, key "state") beside the shim's marks: the job and the boot
// state change together, in the transaction that moves the mark.
type record struct {
	V    uint8      `cbor:"v"`
	Job  jobRecord  `cbor:"job"`
	Boot bootRecord `cbor:"boot"`
}

// jobRecord is the current (or last) job.
type jobRecord struct {
	ID      string `cbor:"id"`
	State   State  `cbor:"state"`
	Slot    string `cbor:"slot"`    // the slot the image goes to
	Image   []byte `cbor:"image"`   // SHA-256 of the image
	Size    uint64 `cbor:"size"`    // bytes
	Chunk   uint64 `cbor:"chunk"`   // bytes per chunk at most
	Version uint64 `cbor:"version"` // the image's security version
	Bytes   uint64 `cbor:"bytes"`   // received, durable in the slot
	Hash    []byte `cbor:"hash"`    // SHA-256 state over the bytes received (MarshalBinary)
	Token   uint64 `cbor:"token"`   // token and seq of the last step
	Seq     uint64 `cbor:"seq"`
	Reason  string `cbor:"reason"` // why it failed or rolled back
}

// bootRecord is what the boot loader reads.
type bootRecord struct {
	Active      string `cbor:"active"`       // the committed slot, booted when no trial is armed
	ActiveImage []byte `cbor:"active_image"` // its SHA-256
	Running     string `cbor:"running"`      // the slot booted last
	Security    uint64 `cbor:"security"`     // running security version: nothing older begins
	Trial       string `cbor:"trial"`        // "" or the slot armed for trial boots
	TrialImage  []byte `cbor:"trial_image"`  // its SHA-256, verified again before each trial boot
	Tries       uint8  `cbor:"tries"`        // trial boots left
	Boots       uint64 `cbor:"boots"`        // boots so far
}

var bucket = []byte("fwjob")

var stateKey = []byte("state")

var recEnc, recDec = func() (cbor.EncMode, cbor.DecMode) {
	enc, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err) // static options
	}
	dec, err := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		UTF8:              cbor.UTF8RejectInvalid,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		MaxMapPairs:       64,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return enc, dec
}()

// getRecord reads the record; ok is false when there is none (never
// booted). A record that does not decode or does not hold together is
// ErrStorage: the device refuses firmware steps rather than guess.
func getRecord(tx *bbolt.Tx) (r record, ok bool, err error) {
	b := tx.Bucket(bucket)
	if b == nil {
		return record{}, false, nil
	}
	v := b.Get(stateKey)
	if v == nil {
		return record{}, false, nil
	}
	if err := recDec.Unmarshal(v, &r); err != nil {
		return record{}, false, fmt.Errorf("%w: job record: %w", ErrStorage, err)
	}
	if err := r.valid(); err != nil {
		return record{}, false, fmt.Errorf("%w: job record: %w", ErrStorage, err)
	}
	return r, true, nil
}

func putRecord(tx *bbolt.Tx, r record) error {
	r.V = recordVersion
	v, err := recEnc.Marshal(r)
	if err != nil {
		return fmt.Errorf("%w: encode job record: %w", ErrStorage, err)
	}
	b, err := tx.CreateBucketIfNotExists(bucket)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return b.Put(stateKey, v)
}

// valid checks what a reader relies on.
func (r *record) valid() error {
	isSlot := func(s string) bool { return s == SlotA || s == SlotB }
	switch {
	case r.V != recordVersion:
		return fmt.Errorf("version %d, want %d", r.V, recordVersion)
	case !slices.Contains(States, r.Job.State):
		return fmt.Errorf("job state %q", r.Job.State)
	case !isSlot(r.Boot.Active) || !isSlot(r.Boot.Running):
		return fmt.Errorf("slots active %q running %q", r.Boot.Active, r.Boot.Running)
	case r.Boot.Trial != "" && r.Boot.Trial == r.Boot.Active:
		return fmt.Errorf("trial slot %q is the active one", r.Boot.Trial)
	case r.Boot.Trial != "" && !isSlot(r.Boot.Trial):
		return fmt.Errorf("trial slot %q", r.Boot.Trial)
	case r.Job.State != Idle && (!isSlot(r.Job.Slot) || r.Job.Bytes > r.Job.Size):
		return fmt.Errorf("job slot %q, %d of %d bytes", r.Job.Slot, r.Job.Bytes, r.Job.Size)
	}
	return nil
}

// Status is the device's firmware state: the job and the boot state.
type Status struct {
	Job     string // "" when idle
	State   State
	Bytes   uint64 // received
	Size    uint64
	Image   []byte // SHA-256 of the job's image
	Version uint64 // the job's image's security version
	Reason  string
	Token   fence.Token // of the last step
	Seq     uint64

	Slot     string // the running slot
	Active   string // the committed slot
	Trial    string // "" or the slot armed for trial boots
	Tries    uint8  // trial boots left
	Security uint64 // running security version
	Boots    uint64
	// ActiveImage and TrialImage are the SHA-256 the boot loader holds
	// for the active and the trial slot.
	ActiveImage, TrialImage []byte
}

func (r *record) status() Status {
	j, b := r.Job, r.Boot
	return Status{Job: j.ID, State: j.State, Bytes: j.Bytes, Size: j.Size, Image: j.Image, Version: j.Version,
		Reason: j.Reason, Token: fence.Token(j.Token), Seq: j.Seq,
		Slot: b.Running, Active: b.Active, Trial: b.Trial, Tries: b.Tries, Security: b.Security, Boots: b.Boots,
		ActiveImage: b.ActiveImage, TrialImage: b.TrialImage}
}

// Report is the "fw" field of the device's state report: job, state,
// bytes, size, slot (the running one), version (the running security
// version), reason, token (of the last step) and image (RunningImage in
// hex).
func (s Status) Report() map[string]any {
	return map[string]any{
		"job": s.Job, "state": string(s.State), "bytes": s.Bytes, "size": s.Size,
		"slot": s.Slot, "version": s.Security, "reason": s.Reason, "token": uint64(s.Token),
		"image": hex.EncodeToString(s.RunningImage()),
	}
}

// RunningImage is the SHA-256 of the running slot's image as the boot
// loader holds it: the active image's, or the trial's while a trial runs;
// nil after fw.cancel disarmed the trial the device runs (it boots the
// active slot at once: RebootPending).
func (s Status) RunningImage() []byte {
	switch s.Slot {
	case s.Active:
		return s.ActiveImage
	case s.Trial:
		return s.TrialImage
	}
	return nil
}

// ReadStatus reads the firmware state in tx (a View of the device's
// database). ErrNotBooted if Boot never ran there.
func ReadStatus(tx *bbolt.Tx) (Status, error) {
	r, ok, err := getRecord(tx)
	if err != nil {
		return Status{}, err
	}
	if !ok {
		return Status{}, ErrNotBooted
	}
	return r.status(), nil
}
