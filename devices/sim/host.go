package sim

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
)

// HostConfig configures a Host. The zero value is valid.
type HostConfig struct {
	// VerdictLog receives one JSON line per decision (see VerdictRecord);
	// nil means none. Write errors are logged, never fatal.
	VerdictLog io.Writer
	// Kind is what the Host simulates; empty means DeviceThermostat. Test
	// and demo builds (-tags edgefence_unsafe) also have DeviceUnfenced.
	Kind DeviceKind
	// Logger receives log lines; nil means none.
	Logger *slog.Logger
	// Now is the clock for verdict log times; nil means time.Now.
	Now func() time.Time
	// History, if not nil, gets the fence point's decisions as history
	// events (shim.Options.History). The Host does not close it.
	History *history.Writer
	// Keys, if set, makes the fence point accept only signed envelopes by
	// keys it allows for the device (shim.Options.Keys, an auth.Trust).
	Keys auth.Keys
	// Root, if set, checks the operator's fence resets (shim.Options.Root;
	// an auth.RootKey, for devices that take unsigned commands).
	Root auth.ResetVerifier
}

// DeviceKind names what a Host simulates.
type DeviceKind string

// DeviceThermostat is a Thermostat behind a fence point (package shim): the
// default, and the only kind of a shipped build.
const DeviceThermostat DeviceKind = "thermostat"

// ErrDeviceKind means HostConfig.Kind names no device kind of this build.
var ErrDeviceKind = errors.New("sim: unknown device kind")

// fencePoint is what a Host's devices sit behind: the shim for
// DeviceThermostat (*shim.Shim), something else for the kinds of test and
// demo builds.
type fencePoint interface {
	Process(device string, raw []byte, d shim.Device) shim.Result
	Mark(device string) (fence.Mark, error)
	Stats() shim.Stats
	View(fn func(tx *bbolt.Tx) error) error
	Close() error
}

// openers opens the fence point of each device kind this build has.
var openers = map[DeviceKind]func(path string, cfg HostConfig) (fencePoint, error){
	DeviceThermostat: openShim,
}

func openShim(path string, cfg HostConfig) (fencePoint, error) {
	s, err := shim.Open(path, &shim.Options{Logger: cfg.Logger, History: cfg.History, Keys: cfg.Keys, Root: cfg.Root})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Host runs simulated devices behind one fence point (one bbolt file), with
// no network: a Fleet puts one on MQTT, tests may drive one directly.
type Host struct {
	fp   fencePoint
	vlog *verdictLog
	log  *slog.Logger
	now  func() time.Time
}

// OpenHost opens (creating if needed) the bbolt file at path, which holds
// both the fence marks and the device states; a re-open resumes both.
func OpenHost(path string, cfg HostConfig) (*Host, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Kind == "" {
		cfg.Kind = DeviceThermostat
	}
	open, ok := openers[cfg.Kind]
	if !ok {
		return nil, fmt.Errorf("%w %q: this build has %q", ErrDeviceKind, cfg.Kind, slices.Sorted(maps.Keys(openers)))
	}
	fp, err := open(path, cfg)
	if err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Host{fp: fp, vlog: &verdictLog{w: cfg.VerdictLog}, log: log, now: now}, nil
}

// Close closes the database.
func (h *Host) Close() error { return h.fp.Close() }

// Outcome is what handling one command produced.
type Outcome struct {
	Ack     fence.Ack
	Record  VerdictRecord // as written to the verdict log
	Applied bool          // the command took effect; Record.State is the new state
	// Update is set when the payload was a trust update, not a command
	// (HostConfig.Keys an *auth.Trust): what it did. There is no ack to
	// send and no verdict log line.
	Update *auth.Learned
}

// Handle decides one command addressed to device (raw is the encoded
// envelope), applies it if admitted, and appends the verdict log line. A
// trust update is taken in instead (Outcome.Update). It never panics.
func (h *Host) Handle(device string, raw []byte) Outcome {
	return h.outcome(h.fp.Process(device, raw, Thermostat{}))
}

// batcher is a fence point that decides several commands with one commit
// (*shim.Shim).
type batcher interface {
	ProcessBatch(reqs []shim.Request, d shim.Device) []shim.Result
}

// HandleAll is Handle of several commands, in order; with the thermostat's
// fence point their accepts share one commit (shim.ProcessBatch), made
// before it returns.
func (h *Host) HandleAll(reqs []shim.Request) []Outcome {
	var res []shim.Result
	if b, ok := h.fp.(batcher); ok {
		res = b.ProcessBatch(reqs, Thermostat{})
	} else {
		for _, r := range reqs {
			res = append(res, h.fp.Process(r.Device, r.Raw, Thermostat{}))
		}
	}
	outs := make([]Outcome, len(res))
	for i, r := range res {
		outs[i] = h.outcome(r)
	}
	return outs
}

// outcome completes a fence point's result: the state read, the verdict
// log line written.
func (h *Host) outcome(res shim.Result) Outcome {
	if res.Update != nil {
		return Outcome{Update: res.Update}
	}
	a := res.Ack
	rec := VerdictRecord{Time: h.now().UTC(), Device: a.Device, Token: a.Token, Seq: a.Seq, ID: a.ID,
		Verdict: a.Verdict, MaxToken: a.MaxToken, LastSeq: a.LastSeq, Epoch: a.Epoch, Reason: a.Reason}
	if env := res.Envelope; env != nil {
		rec.Kind, rec.Holder = env.Kind, env.Holder
	}
	if a.Device != "" {
		st, err := readState(h.fp, a.Device)
		if err != nil {
			h.log.Error("read device state", "device", a.Device, "err", err)
		} else {
			rec.State = &st
		}
	}
	if err := h.vlog.write(&rec); err != nil {
		h.log.Error("verdict log", "err", err)
	}
	return Outcome{Ack: a, Record: rec, Applied: res.Applied}
}

// State returns a device's current state (InitialState if it has applied
// nothing).
func (h *Host) State(device string) (State, error) {
	if err := fence.ValidateDeviceID(device); err != nil {
		return State{}, err
	}
	st, err := readState(h.fp, device)
	if err != nil {
		return State{}, fmt.Errorf("sim: state of %s: %w", device, err)
	}
	return st, nil
}

// Mark returns a device's fence mark.
func (h *Host) Mark(device string) (fence.Mark, error) { return h.fp.Mark(device) }

// Stats returns the fence point's counters; Invalid counts bad input.
func (h *Host) Stats() shim.Stats { return h.fp.Stats() }
