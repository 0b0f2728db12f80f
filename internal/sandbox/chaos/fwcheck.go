package chaos

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// The firmware scenario's end-state checks, as Violation.Invariant (the
// history's own firmware invariant is history.InvariantActivation, FW1).
const (
	// InvariantImage (FW2): every device ends committed on the job's
	// image, running its active slot, whose bytes hash to the job's
	// SHA-256.
	InvariantImage = "FW2"
	// InvariantJobEnd (FW3): every execution ended succeeded (no fault of
	// the scenario makes a device fail the job).
	InvariantJobEnd = "FW3"
)

// deviceState reads dev's firmware state from its database (the device
// process must be stopped: it holds the file's lock) and the SHA-256 of
// its active slot's bytes.
func (r *round) deviceState(dev string) (fwjob.Status, []byte, error) {
	dir := r.path("devices/" + dev)
	if r.cfg.CDeviceBin != "" {
		return cDeviceState(r.cfg.CDeviceBin, dir, dev)
	}
	db, err := bbolt.Open(fwjob.DBPath(dir), 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fwjob.Status{}, nil, fmt.Errorf("device %s: %w", dev, err)
	}
	defer db.Close()
	var st fwjob.Status
	if err := db.View(func(tx *bbolt.Tx) error {
		st, err = fwjob.ReadStatus(tx)
		return err
	}); err != nil {
		return st, nil, fmt.Errorf("device %s: %w", dev, err)
	}
	sum, err := slotSum(dir, dev, st)
	return st, sum, err
}

// slotSum is the SHA-256 of the bytes of st's active slot in dir.
func slotSum(dir, dev string, st fwjob.Status) ([]byte, error) {
	f, err := os.Open(fwjob.SlotPath(dir, st.Active))
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", dev, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("device %s: slot %s: %w", dev, st.Active, err)
	}
	return h.Sum(nil), nil
}

// cDeviceState reads the C device's firmware state from its flash files
// (efsdev --fw-status, the device stopped) and the SHA-256 of its active
// slot's bytes.
func cDeviceState(bin, dir, dev string) (fwjob.Status, []byte, error) {
	st, err := sandbox.CDeviceFirmwareStatus(bin, dir, dev)
	if err != nil {
		return st, nil, err
	}
	sum, err := slotSum(dir, dev, st)
	return st, sum, err
}

// statusText is a device's firmware state for a message: its fw report
// and its boot state.
func statusText(st fwjob.Status) string {
	return fmt.Sprintf("fw %v; active %s (%x…), trial %q, tries %d", st.Report(), st.Active, head(st.ActiveImage), st.Trial, st.Tries)
}

func head(b []byte) []byte { return b[:min(len(b), 6)] }

// deviceStates describes, for an error, the devices whose executions have
// not ended: each execution and the device's firmware state.
func (r *round) deviceStates(execs []jobs.Execution) error {
	var errs []error
	for _, e := range execs {
		if e.Status.Terminal() {
			continue
		}
		st, _, err := r.deviceState(e.Device)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, fmt.Errorf("device %s: execution %s step %s bytes %d/%d gateway %s token %d; device %s",
			e.Device, e.Status, e.Step, e.Bytes, e.Size, e.Gateway, e.Token, statusText(st)))
	}
	return errors.Join(errs...)
}

// deviceEnd is a device's firmware state at the end of a round.
type deviceEnd struct {
	st   fwjob.Status
	slot []byte // SHA-256 of the active slot's bytes
	err  error  // the state could not be read
}

// checkFirmwareEnd adds to the round's report the violations of FW2 and
// FW3 and counts the executions by status. sum is the job's image (hex
// SHA-256).
func (r *round) checkFirmwareEnd(execs []jobs.Execution, sum string) {
	ends := map[string]deviceEnd{}
	for _, dev := range r.shimDevs {
		st, slot, err := r.deviceState(dev)
		ends[dev] = deviceEnd{st, slot, err}
	}
	r.res.Executions = map[string]int{}
	for _, e := range execs {
		r.res.Executions[string(e.Status)]++
	}
	r.res.Report.Violations = append(r.res.Report.Violations, firmwareEnd(r.shimDevs, execs, ends, sum)...)
}

// firmwareEnd checks FW2 and FW3, device by device: the job (its image sum,
// hex SHA-256) over devs ended with execs and left the devices in ends.
func firmwareEnd(devs []string, execs []jobs.Execution, ends map[string]deviceEnd, sum string) []history.Violation {
	want, _ := hex.DecodeString(sum)
	byDev := map[string]jobs.Execution{}
	for _, e := range execs {
		byDev[e.Device] = e
	}
	var vs []history.Violation
	bad := func(inv, dev, format string, args ...any) {
		vs = append(vs, history.Violation{Invariant: inv, Device: dev, Detail: fmt.Sprintf(format, args...)})
	}
	short := sum[:min(len(sum), 12)]
	for _, dev := range devs {
		if e, ok := byDev[dev]; !ok || e.Status != jobs.Succeeded {
			bad(InvariantJobEnd, dev, "execution of %s ended %q (%s), want succeeded", fwJobID, e.Status, e.Reason)
		}
		d, ok := ends[dev]
		st := d.st
		switch {
		case !ok || d.err != nil:
			bad(InvariantImage, dev, "firmware state unreadable: %v", d.err)
		case st.State != fwjob.Committed || st.Job != fwJobID || st.Slot != st.Active || st.Trial != "" ||
			!bytes.Equal(st.ActiveImage, want):
			bad(InvariantImage, dev, "not committed on the job's image %s…: %s", short, statusText(st))
		case !bytes.Equal(d.slot, want):
			bad(InvariantImage, dev, "active slot %s holds %x…, not the job's image %s…", st.Active, head(d.slot), short)
		}
	}
	return vs
}
