package fwjob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/devices/shim"
)

// DefaultHealthWindow is BootConfig.Window's default.
const DefaultHealthWindow = 30 * time.Second

// BootConfig configures Boot.
type BootConfig struct {
	// Health is the device's own check of a trial boot (the new image
	// runs, its application comes up): nil error within Window confirms
	// the trial (the job becomes confirming); an error, a panic or no
	// answer within Window rolls back to the old slot. nil: always passes.
	Health func(ctx context.Context, b BootInfo) error
	// Window bounds Health; zero means DefaultHealthWindow.
	Window time.Duration
	// Security is the security version of the factory image in slot a,
	// used on the first boot only.
	Security uint64
	// LockTimeout bounds the wait for the database file lock; zero means
	// shim.DefaultLockTimeout.
	LockTimeout time.Duration
	// Logger receives the boot's log lines; nil means none.
	Logger *slog.Logger

	crash func(point string) // tests
}

// BootInfo is the slot a boot started.
type BootInfo struct {
	Slot  string // "a" or "b"
	Path  string // its file
	Image []byte // its SHA-256 as the boot loader holds it (verified for a trial)
	Trial bool   // a trial boot of a new image
	// Status is the firmware state after the boot (and its health check).
	Status Status
}

// Boot is what the device does when it (re)starts, before it opens its
// fence point on DBPath(dir): the boot loader's part. The first boot
// records slot a (created empty if absent) as the active image. A job left
// installing is verified now. If a trial boot is armed, its slot is
// verified against the image hash, a try is spent (committed with fsync
// before the new image runs), and Health decides: confirming, or a roll
// back to the old slot with the reason (rolled_back). A trial whose tries
// are spent, or whose slot does not verify, is rolled back without
// running. Otherwise the active slot boots.
//
// A power loss anywhere in Boot leaves a record the next Boot takes up:
// during the health check, the spent try is durable, so a new image that
// never gets through its check is abandoned after BootConfig's tries.
// If ctx ends during the health check, Boot returns its error and decides
// nothing (the next Boot tries again).
func Boot(ctx context.Context, dir string, cfg BootConfig) (BootInfo, error) {
	if cfg.Window <= 0 {
		cfg.Window = DefaultHealthWindow
	}
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = shim.DefaultLockTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	db, err := bbolt.Open(DBPath(dir), 0o600, &bbolt.Options{Timeout: cfg.LockTimeout})
	if err != nil {
		if errors.Is(err, bberrors.ErrTimeout) {
			return BootInfo{}, fmt.Errorf("fwjob: boot: %w: %s: %w", shim.ErrLocked, DBPath(dir), err)
		}
		return BootInfo{}, fmt.Errorf("fwjob: boot: %w", err)
	}
	defer db.Close()

	var r record
	if err := db.Update(func(tx *bbolt.Tx) error {
		var err error
		r, err = loadForBoot(tx, dir, cfg.Security, log)
		return err
	}); err != nil {
		return BootInfo{}, fmt.Errorf("fwjob: boot: %w", err)
	}
	if cfg.crash != nil {
		cfg.crash("boot.armed")
	}
	info := bootInfo(dir, &r)
	if !info.Trial {
		log.Info("booted", "slot", info.Slot, "state", r.Job.State, "reason", r.Job.Reason)
		return info, nil
	}
	herr := health(ctx, cfg, info)
	if herr != nil && ctx.Err() != nil {
		return info, fmt.Errorf("fwjob: boot: health check of slot %s interrupted: %w", info.Slot, ctx.Err())
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		return confirm(tx, &r, herr)
	}); err != nil {
		return BootInfo{}, fmt.Errorf("fwjob: boot: %w", err)
	}
	log.Info("trial boot", "slot", info.Slot, "healthy", herr == nil, "state", r.Job.State, "reason", r.Job.Reason)
	return bootInfo(dir, &r), nil
}

// loadForBoot is the boot loader's transaction: it reads (or creates) the
// record, settles an install, picks the slot to boot and spends a try.
func loadForBoot(tx *bbolt.Tx, dir string, security uint64, log *slog.Logger) (record, error) {
	r, ok, err := getRecord(tx)
	if err != nil {
		return r, err
	}
	if !ok {
		if r, err = factory(dir, security); err != nil {
			return r, err
		}
	}
	if r.Job.State == Installing {
		finishInstall(dir, &r)
	}
	b := &r.Boot
	b.Boots++
	b.Running = b.Active
	switch {
	case b.Trial == "":
	case b.Tries == 0:
		disarm(&r, "trial boots exhausted: the new image never confirmed")
	default:
		if err := verifySlot(dir, b.Trial, b.TrialImage); err != nil {
			log.Error("trial slot does not verify; booting the old slot", "err", err)
			disarm(&r, "trial boot refused: "+err.Error())
			break
		}
		b.Tries--
		b.Running = b.Trial
	}
	return r, putRecord(tx, r)
}

// factory is the record of a device's first boot: slot a holds the
// factory image (an empty one if there is no file).
func factory(dir string, security uint64) (record, error) {
	p := SlotPath(dir, SlotA)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		if err := resetSlot(dir, SlotA); err != nil {
			return record{}, err
		}
	}
	sum, _, err := hashSlot(dir, SlotA)
	if err != nil {
		return record{}, fmt.Errorf("%w: factory slot: %w", ErrStorage, err)
	}
	return record{V: recordVersion, Job: jobRecord{State: Idle},
		Boot: bootRecord{Active: SlotA, ActiveImage: sum, Running: SlotA, Security: security}}, nil
}

// health runs the check within the window; a panic is a failure.
func health(ctx context.Context, cfg BootConfig, info BootInfo) (err error) {
	if cfg.crash != nil {
		cfg.crash("boot.health")
	}
	if cfg.Health == nil {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, cfg.Window)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("health check panicked: %v", p)
		}
	}()
	if err := cfg.Health(hctx, info); err != nil {
		return fmt.Errorf("health check failed: %w", err)
	}
	if hctx.Err() != nil {
		return fmt.Errorf("health check did not pass within %v", cfg.Window)
	}
	return nil
}

// confirm records the health check's verdict on the trial boot: the job
// waiting on it is confirming, or the trial is rolled back.
func confirm(tx *bbolt.Tx, r *record, herr error) error {
	cur, ok, err := getRecord(tx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: job record vanished during the boot", ErrStorage)
	}
	*r = cur
	if herr != nil {
		disarm(r, herr.Error())
		r.Boot.Running = r.Boot.Active
	} else if r.Job.State == Rebooting {
		r.Job.State = Confirming
	}
	return putRecord(tx, *r)
}

func bootInfo(dir string, r *record) BootInfo {
	b := r.Boot
	trial := b.Trial != "" && b.Running == b.Trial
	img := b.ActiveImage
	if trial {
		img = b.TrialImage
	}
	return BootInfo{Slot: b.Running, Path: SlotPath(dir, b.Running), Image: img, Trial: trial, Status: r.status()}
}
