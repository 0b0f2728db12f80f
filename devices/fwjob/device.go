package fwjob

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"strings"
	"unicode/utf8"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// DefaultBootTries is Config.BootTries's default: trial boots of a new
// image before the boot loader falls back to the old slot by itself.
const DefaultBootTries = 3

// Config configures a Device.
type Config struct {
	// Dir is the device's directory: slot-a, slot-b and DBFile. It must
	// exist.
	Dir string
	// Device is the device id whose firmware this is; commands for any
	// other device are refused.
	Device string
	// MaxImage bounds an image's size in bytes; zero means DefaultMaxImage.
	MaxImage uint64
	// BootTries is how many trial boots fw.activate arms; zero means
	// DefaultBootTries.
	BootTries uint8
	// Manifests, when set, is the operator's root as this device knows it
	// (a *auth.Trust or *auth.RootKey): every fw.begin must carry the
	// image's manifest signed by it, naming the begin's image, size and
	// version (ErrManifest otherwise). Nil: manifests are not checked.
	Manifests auth.ManifestVerifier
	// Logger receives the device's log lines; nil means none.
	Logger *slog.Logger
	// Other, if set, takes the commands that are not firmware steps
	// (IsKind false): the device's application (a thermostat, say) behind
	// the same fence point, its effect committed with the mark as a step's
	// is. nil refuses them as an unknown kind.
	Other Application

	crash func(point string) // tests: called at the named crash points
}

// Application is what Config.Other is: a device model that applies its
// commands in the shim's transaction.
type Application interface {
	shim.Device
	shim.TxApplier
}

// Device is a firmware-updatable device behind a fence point: it runs the
// job state machine of the fw.* commands (see the package doc). It
// implements shim.Device and shim.TxApplier: the job record commits in the
// transaction that moves the mark.
type Device struct {
	cfg Config
	log *slog.Logger
}

var (
	_ shim.Device    = (*Device)(nil)
	_ shim.TxApplier = (*Device)(nil)
)

// New returns the firmware device of cfg.Device in cfg.Dir.
func New(cfg Config) (*Device, error) {
	if err := fence.ValidateDeviceID(cfg.Device); err != nil {
		return nil, fmt.Errorf("fwjob: %w", err)
	}
	if st, err := os.Stat(cfg.Dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("fwjob: device directory %q: not a directory (%v)", cfg.Dir, err)
	}
	if cfg.MaxImage == 0 {
		cfg.MaxImage = DefaultMaxImage
	}
	if cfg.BootTries == 0 {
		cfg.BootTries = DefaultBootTries
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Device{cfg: cfg, log: log.With("device", cfg.Device)}, nil
}

// Check validates a firmware command on its own: kind, body, bounds. The
// job's state is checked in ApplyTx, after the admit rule, so that a
// deposed holder's step is refused stale, not invalid.
func (d *Device) Check(env *fence.Envelope) error {
	if env.Device != d.cfg.Device {
		return fmt.Errorf("%w: this is the firmware of %s, not %s", ErrCommand, d.cfg.Device, env.Device)
	}
	if d.cfg.Other != nil && !IsKind(env.Kind) {
		return d.cfg.Other.Check(env)
	}
	_, err := d.parse(env)
	return err
}

// parse decodes and checks a firmware command on its own: parseStep and,
// for fw.begin, the image manifest.
func (d *Device) parse(env *fence.Envelope) (step, error) {
	s, err := parseStep(env, d.cfg.MaxImage)
	if err == nil && s.kind == KindBegin {
		err = d.checkManifest(s)
	}
	return s, err
}

// checkManifest checks a fw.begin's manifest against Config.Manifests:
// present, signed by the operator's root, naming the begin's image, size
// and version.
func (d *Device) checkManifest(s step) error {
	if d.cfg.Manifests == nil {
		return nil
	}
	var why error
	if len(s.manifest) == 0 {
		why = errors.New("none: this device installs only images the operator signed")
	} else if m, err := d.cfg.Manifests.VerifyManifest(s.manifest); err != nil {
		why = err
	} else if !bytes.Equal(m.Image, s.image) || m.Size != s.size || m.Version != s.version {
		why = fmt.Errorf("signed for image %x, %d bytes, version %d; fw.begin names %x, %d bytes, version %d",
			m.Image, m.Size, m.Version, s.image, s.size, s.version)
	}
	if why == nil {
		return nil
	}
	err := fmt.Errorf("%w: fw.begin of job %s: manifest: %w", ErrManifest, s.job, why)
	d.log.Warn("firmware job refused", "job", s.job, "err", err)
	return err
}

// Apply is never called by the shim for a TxApplier; it refuses.
func (d *Device) Apply(*fence.Envelope) error {
	return errors.New("fwjob: a Device applies only inside the shim's transaction")
}

// ApplyTx takes one step of the job in the shim's write transaction: the
// job record (and the boot state) are written in tx; a chunk's data is
// written to the slot and fsynced before tx commits (a command of another
// kind goes to Config.Other). An error refuses the
// step (Invalid) and nothing moves: the record, the mark and the bytes the
// device counts as received stay as they were.
func (d *Device) ApplyTx(tx *bbolt.Tx, env *fence.Envelope) error {
	if d.cfg.Other != nil && !IsKind(env.Kind) {
		return d.cfg.Other.ApplyTx(tx, env)
	}
	s, err := d.parse(env)
	if err != nil {
		return err
	}
	r, ok, err := getRecord(tx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotBooted, DBPath(d.cfg.Dir))
	}
	if err := d.step(&r, s); err != nil {
		return err
	}
	r.Job.Token, r.Job.Seq = uint64(env.Token), env.Seq
	d.log.Info("firmware step", "kind", s.kind, "job", s.job, "state", r.Job.State, "bytes", r.Job.Bytes,
		"token", env.Token, "seq", env.Seq)
	return putRecord(tx, r)
}

// step applies s to r, or says why it is illegal.
func (d *Device) step(r *record, s step) error {
	j := &r.Job
	if j.State.InProgress() && s.job != j.ID {
		return fmt.Errorf("%w: job %s in progress (state %s): %s of job %s refused", ErrBusy, j.ID, j.State, s.kind, s.job)
	}
	if s.kind == KindBegin {
		return d.begin(r, s)
	}
	if s.job != j.ID {
		return fmt.Errorf("%w: %s of job %s: no such job here (state %s, last job %q)", ErrState, s.kind, s.job, j.State, j.ID)
	}
	switch s.kind {
	case KindChunk:
		return d.chunk(j, s)
	case KindInstall:
		return advance(j, s.kind, Downloaded, Installing)
	case KindActivate:
		if err := advance(j, s.kind, Installed, Rebooting); err != nil {
			return err
		}
		r.Boot.Trial, r.Boot.TrialImage, r.Boot.Tries = j.Slot, j.Image, d.cfg.BootTries
		return nil
	case KindCommit:
		b := &r.Boot
		if j.State == Confirming && (b.Trial == "" || b.Running != b.Trial) {
			return fmt.Errorf("%w: confirming, but the running slot %s is not the trial %q", ErrStorage, b.Running, b.Trial)
		}
		if err := advance(j, s.kind, Confirming, Committed); err != nil {
			return err
		}
		b.Active, b.ActiveImage, b.Security = b.Trial, b.TrialImage, max(b.Security, j.Version)
		b.Trial, b.TrialImage, b.Tries = "", nil, 0
		return nil
	case KindCancel:
		return cancel(r)
	}
	return fmt.Errorf("%w: unknown kind %q", ErrCommand, s.kind) // parseStep refused it already
}

// advance moves j from state from to state to, or refuses naming j's state.
func advance(j *jobRecord, kind string, from, to State) error {
	if j.State != from {
		return illegal(j, kind)
	}
	j.State = to
	return nil
}

func illegal(j *jobRecord, kind string) error {
	return fmt.Errorf("%w: %s of job %s in state %s", ErrState, kind, j.ID, j.State)
}

// begin starts a job: the new image goes to the slot that is not active.
func (d *Device) begin(r *record, s step) error {
	j := r.Job
	switch {
	case j.State.InProgress():
		return illegal(&j, s.kind)
	case j.ID == s.job:
		return fmt.Errorf("%w: fw.begin of job %s: it ran already, state %s", ErrState, s.job, j.State)
	case r.Boot.Running != r.Boot.Active:
		return fmt.Errorf("%w: fw.begin of job %s: state %s, reboot pending (running slot %s, boot slot %s)",
			ErrState, s.job, j.State, r.Boot.Running, r.Boot.Active)
	case s.version < r.Boot.Security:
		return fmt.Errorf("%w: fw.begin of job %s: image version %d below the running security version %d",
			ErrRollback, s.job, s.version, r.Boot.Security)
	}
	slot := otherSlot(r.Boot.Active)
	if err := resetSlot(d.cfg.Dir, slot); err != nil {
		return err
	}
	d.crashpoint("begin.reset")
	h, err := marshalHash(sha256.New())
	if err != nil {
		return err
	}
	r.Job = jobRecord{ID: s.job, State: Downloading, Slot: slot, Image: s.image, Size: s.size, Chunk: s.chunk,
		Version: s.version, Hash: h}
	return nil
}

// chunk writes a chunk into the job's slot (fsynced before the record
// commits) and counts it; the last one is checked against the image hash.
func (d *Device) chunk(j *jobRecord, s step) error {
	n := uint64(len(s.data))
	switch {
	case j.State != Downloading:
		return illegal(j, s.kind)
	case s.off != j.Bytes:
		return fmt.Errorf("%w: job %s: expected offset %d, got %d", ErrOffset, j.ID, j.Bytes, s.off)
	case n > j.Chunk:
		return fmt.Errorf("%w: job %s: chunk of %d bytes, the job's chunks are at most %d", ErrCommand, j.ID, n, j.Chunk)
	case n > j.Size-j.Bytes:
		return fmt.Errorf("%w: job %s: chunk of %d bytes at %d runs past the image's %d bytes", ErrCommand, j.ID, n, s.off, j.Size)
	}
	h, err := unmarshalHash(j.Hash)
	if err != nil {
		return err
	}
	h.Write(s.data)
	if err := writeSlot(d.cfg.Dir, j.Slot, s.off, s.data); err != nil {
		return err
	}
	d.crashpoint("chunk.written")
	if j.Hash, err = marshalHash(h); err != nil {
		return err
	}
	j.Bytes += n
	if j.Bytes == j.Size {
		if sum := h.Sum(nil); string(sum) == string(j.Image) {
			j.State = Downloaded
		} else {
			j.State, j.Reason = Failed, fmt.Sprintf("received image SHA-256 %s, want %s", short(sum), short(j.Image))
		}
	}
	return nil
}

// cancel aborts the job in progress: before a trial boot is armed it
// fails; after, the trial is disarmed and the device boots its old slot
// (at once if it runs the new one: Status.RebootPending).
func cancel(r *record) error {
	j := &r.Job
	switch j.State {
	case Downloading, Downloaded, Installing, Installed:
		j.State, j.Reason = Failed, "canceled"
	case Rebooting, Confirming:
		disarm(r, "canceled")
	default:
		return illegal(j, KindCancel)
	}
	return nil
}

// disarm ends a trial: the boot loader boots the active slot again, and
// a job waiting on the trial is rolled back with reason.
func disarm(r *record, reason string) {
	r.Boot.Trial, r.Boot.TrialImage, r.Boot.Tries = "", nil, 0
	if j := &r.Job; j.State == Rebooting || j.State == Confirming {
		j.State, j.Reason = RolledBack, clip(reason)
	}
}

// MaxReasonLen bounds a job's reason (bytes): it travels in the state
// report, and may come from the caller's health check.
const MaxReasonLen = 200

// clip makes reason valid UTF-8 of at most MaxReasonLen bytes: the record
// must always decode.
func clip(reason string) string {
	reason = strings.ToValidUTF8(reason, "?")
	if len(reason) <= MaxReasonLen {
		return reason
	}
	cut := MaxReasonLen
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// finishInstall verifies the job's slot against the image hash: installed,
// or failed with the reason. r's job is in state installing.
func finishInstall(dir string, r *record) {
	j := &r.Job
	if err := verifySlot(dir, j.Slot, j.Image); err != nil {
		j.State, j.Reason = Failed, clip("install: "+err.Error())
		return
	}
	j.State = Installed
}

func marshalHash(h hash.Hash) ([]byte, error) {
	b, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("%w: hash state: %w", ErrStorage, err)
	}
	return b, nil
}

func unmarshalHash(b []byte) (hash.Hash, error) {
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%w: job record's hash state: %w", ErrStorage, err)
	}
	return h, nil
}

func (d *Device) crashpoint(p string) {
	if d.cfg.crash != nil {
		d.cfg.crash(p)
	}
}
