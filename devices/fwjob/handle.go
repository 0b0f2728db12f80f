package fwjob

import (
	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/shim"
)

// Store is the fence point a Device sits behind (a *shim.Shim on the
// device's DBPath).
type Store interface {
	Process(device string, raw []byte, d shim.Device) shim.Result
	View(fn func(tx *bbolt.Tx) error) error
	Update(fn func(tx *bbolt.Tx) error) error
}

// Outcome is what one command did.
type Outcome struct {
	shim.Result
	// Status is the firmware state after the command (and after an
	// install the command started); zero if it could not be read.
	Status Status
	// Reboot says the device must restart now (Status.RebootPending):
	// fw.activate armed a trial boot, or fw.cancel disarmed the one the
	// device runs. The caller exits and starts again through Boot.
	Reboot bool
}

// Handle decides one command for the device at st (shim.Shim.Process with
// d) and then does the device's own part of the step: an accepted
// fw.install is verified over the slot at once (Settle), so that the
// state reported after it is installed or failed.
func (d *Device) Handle(st Store, raw []byte) Outcome {
	res := st.Process(d.cfg.Device, raw, d)
	if res.Applied && res.Envelope != nil && res.Envelope.Kind == KindInstall {
		if err := d.Settle(st); err != nil {
			d.log.Error("install not finished; Boot finishes it", "err", err)
		}
	}
	o := Outcome{Result: res}
	s, err := d.Status(st)
	if err != nil {
		d.log.Error("firmware state unreadable", "err", err)
		return o
	}
	o.Status, o.Reboot = s, s.RebootPending()
	return o
}

// Settle does what the device does on its own after a command: a job in
// state installing is verified over its slot and becomes installed or
// failed (with the reason), in one fsynced transaction. A crash before it
// leaves installing, which the next Boot settles the same way.
func (d *Device) Settle(st Store) error {
	return st.Update(func(tx *bbolt.Tx) error {
		r, ok, err := getRecord(tx)
		if err != nil || !ok || r.Job.State != Installing {
			return err
		}
		d.crashpoint("install.verify")
		finishInstall(d.cfg.Dir, &r)
		d.log.Info("firmware installed", "job", r.Job.ID, "state", r.Job.State, "reason", r.Job.Reason)
		return putRecord(tx, r)
	})
}

// Status reads the device's firmware state at st.
func (d *Device) Status(st Store) (Status, error) {
	var s Status
	err := st.View(func(tx *bbolt.Tx) error {
		var err error
		s, err = ReadStatus(tx)
		return err
	})
	return s, err
}

// RebootPending reports whether the boot loader would now boot another
// slot than the running one: a trial is armed and not yet booted, or a
// trial the device runs was disarmed.
func (s Status) RebootPending() bool {
	next := s.Active
	if s.Trial != "" {
		next = s.Trial
	}
	return next != s.Slot
}
