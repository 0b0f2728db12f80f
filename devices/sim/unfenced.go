//go:build edgefence_unsafe

package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// DeviceUnfenced is a Thermostat with no fence point, for tests and
// demonstrations ONLY (it exists in builds with -tags edgefence_unsafe):
// it applies every decodable command its Check accepts, stale ones and
// duplicates too, so that a test can show the same schedule corrupting the
// state the fence protects. It acks every command it applied as Accepted
// (the reason says "FENCE DISABLED: ..." when the admit rule would have
// refused it) with the highest mark it has seen, which only rises, and
// records each decision in HostConfig.History (after its commit).
const DeviceUnfenced DeviceKind = "unfenced-thermostat"

func init() { openers[DeviceUnfenced] = openUnfenced }

// unfencedBucket holds the highest mark each device has seen, as a
// fence.MarkRecord (information for the acks; it decides nothing).
var unfencedBucket = []byte("sim.unfenced.marks")

// unfenced is the fence point of DeviceUnfenced: none.
type unfenced struct {
	db   *bbolt.DB
	log  *slog.Logger
	hist *history.Writer

	mu     sync.Mutex // serializes commands and Close
	closed bool

	accepted, invalid, applyFailed, storage atomic.Uint64
}

func openUnfenced(path string, cfg HostConfig) (fencePoint, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: shim.DefaultLockTimeout})
	if err != nil {
		if errors.Is(err, bberrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s: %w", shim.ErrLocked, path, err)
		}
		return nil, fmt.Errorf("sim: open %s: %w", path, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default() // the warning below must be seen
	}
	log.Warn("FENCE DISABLED: these simulated devices apply stale and duplicate commands; for tests and demos only",
		"path", path, "kind", DeviceUnfenced)
	if cfg.Logger == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &unfenced{db: db, log: log, hist: cfg.History}, nil
}

func (u *unfenced) Process(device string, raw []byte, d shim.Device) shim.Result {
	u.mu.Lock()
	defer u.mu.Unlock()
	res := u.process(device, raw, d)
	a := res.Ack
	e := history.Event{Op: history.OpVerdict, Device: a.Device, ID: a.ID, Token: uint64(a.Token), Seq: a.Seq,
		Verdict: a.Verdict.String(), Reason: a.Reason}
	if res.Envelope != nil {
		e.Kind = res.Envelope.Kind
	}
	if err := u.hist.Record(e); err != nil {
		u.log.Warn("history not written", "device", a.Device, "id", a.ID, "err", err)
	}
	return res
}

// process is Process with u.mu held.
func (u *unfenced) process(device string, raw []byte, d shim.Device) shim.Result {
	if u.closed {
		return u.refuse(device, nil, shim.ErrClosed.Error())
	}
	if err := fence.ValidateDeviceID(device); err != nil {
		return u.refuse("", nil, "addressed device: "+err.Error())
	}
	env, err := fence.UnmarshalEnvelope(raw)
	if err != nil {
		return u.refuse(device, nil, err.Error())
	}
	txa, ok := d.(shim.TxApplier)
	switch {
	case env.Device != device:
		return u.refuse(device, env, fmt.Sprintf("envelope names device %q but was addressed to %q", env.Device, device))
	case !ok:
		return u.refuse(device, env, "the unfenced device kind applies only TxAppliers")
	}
	if err := d.Check(env); err != nil {
		return u.refuse(device, env, "check: "+err.Error())
	}
	var would fence.Verdict
	var next fence.Mark
	err = u.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(unfencedBucket)
		if err != nil {
			return err
		}
		cur, err := seenMark(b, device)
		if err != nil {
			return err
		}
		would, next = fence.Admit(cur, env.Token, env.Seq)
		if would == fence.Accepted {
			v, err := shim.Record{Mark: next, At: time.Now(), Holder: env.Holder, ID: env.ID}.MarshalBinary()
			if err == nil {
				err = b.Put([]byte(device), v)
			}
			if err != nil {
				return err
			}
		}
		if err := txa.ApplyTx(tx, env); err != nil {
			return &applyError{err}
		}
		return nil
	})
	if err != nil {
		if ae := (*applyError)(nil); errors.As(err, &ae) {
			u.applyFailed.Add(1)
			return u.refuse(device, env, "apply: "+ae.err.Error())
		}
		u.storage.Add(1)
		return u.refuse(device, env, fmt.Sprintf("%v: %v", shim.ErrStorage, err))
	}
	u.accepted.Add(1)
	reason := ""
	if would != fence.Accepted {
		reason = "FENCE DISABLED: applied although the fence says " + would.String()
		u.log.Warn("unfenced apply", "device", device, "id", env.ID, "token", env.Token, "seq", env.Seq,
			"would_be", would.String(), "mark", next.String())
	}
	return shim.Result{Ack: fence.NewAck(env, fence.Accepted, next, reason), Envelope: env, Applied: true}
}

type applyError struct{ err error }

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

// refuse answers an Invalid verdict; nothing was applied.
func (u *unfenced) refuse(device string, env *fence.Envelope, reason string) shim.Result {
	u.invalid.Add(1)
	reason = strings.ToValidUTF8(reason, "?")
	u.log.Warn("invalid command refused", "device", device, "reason", reason)
	e := env
	if e == nil {
		e = &fence.Envelope{}
	}
	ack := fence.NewAck(e, fence.Invalid, fence.Mark{}, reason)
	ack.Device = device
	return shim.Result{Ack: ack, Envelope: env}
}

// seenMark reads the highest mark device has seen: the zero Mark if none.
func seenMark(b *bbolt.Bucket, device string) (fence.Mark, error) {
	if b == nil {
		return fence.Mark{}, nil
	}
	v := b.Get([]byte(device))
	if v == nil {
		return fence.Mark{}, nil
	}
	var r shim.Record
	if err := r.UnmarshalBinary(v); err != nil {
		return fence.Mark{}, fmt.Errorf("device %s: %w", device, err)
	}
	return r.Mark, nil
}

func (u *unfenced) Mark(device string) (fence.Mark, error) {
	var m fence.Mark
	err := u.View(func(tx *bbolt.Tx) error {
		var err error
		m, err = seenMark(tx.Bucket(unfencedBucket), device)
		return err
	})
	return m, err
}

func (u *unfenced) Stats() shim.Stats {
	return shim.Stats{Accepted: u.accepted.Load(), Invalid: u.invalid.Load(), ApplyFailed: u.applyFailed.Load(),
		StorageErrors: u.storage.Load()}
}

func (u *unfenced) View(fn func(tx *bbolt.Tx) error) error {
	err := u.db.View(fn)
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return shim.ErrClosed
	}
	return err
}

func (u *unfenced) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil
	}
	u.closed = true
	return u.db.Close()
}
