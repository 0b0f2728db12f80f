package jobs

import (
	"fmt"
	"math"
	"slices"

	"github.com/edgefence/edgefence/devices/fwjob"
)

// fwReport is a device's firmware report, the "fw" field of its state
// report (fwjob.Status.Report): the job it knows, its state and bytes, the
// running slot, security version and image.
type fwReport struct {
	Job     string
	State   fwjob.State
	Bytes   uint64
	Size    uint64
	Slot    string
	Version uint64
	Reason  string
	Token   uint64
	Image   string // hex SHA-256 of the running image; "" if the device does not say
	seq     uint64 // the runner's count of reports when it arrived
}

// inProgress reports whether the device runs a job that blocks others.
func (p fwReport) inProgress() bool { return p.State.InProgress() }

// parseReport reads a "fw" field. State is required and must be one of
// fwjob.States; the other fields are optional (a missing one is zero), but
// one of the wrong type is an error.
func parseReport(m map[string]any) (fwReport, error) {
	var p fwReport
	var state string
	texts := []struct {
		key string
		to  *string
	}{{"job", &p.Job}, {"state", &state}, {"slot", &p.Slot}, {"reason", &p.Reason}, {"image", &p.Image}}
	for _, f := range texts {
		if err := text(m, f.key, f.to); err != nil {
			return p, err
		}
	}
	nums := []struct {
		key string
		to  *uint64
	}{{"bytes", &p.Bytes}, {"size", &p.Size}, {"version", &p.Version}, {"token", &p.Token}}
	for _, f := range nums {
		if err := number(m, f.key, f.to); err != nil {
			return p, err
		}
	}
	p.State = fwjob.State(state)
	if !slices.Contains(fwjob.States, p.State) {
		return p, fmt.Errorf("fw report: state %q: want one of %v", state, fwjob.States)
	}
	if p.Bytes > p.Size && p.State.InProgress() {
		return p, fmt.Errorf("fw report: %d bytes of %d", p.Bytes, p.Size)
	}
	return p, nil
}

func text(m map[string]any, key string, to *string) error {
	v, ok := m[key]
	if !ok || v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("fw report: %s is %T, want text", key, v)
	}
	*to = s
	return nil
}

// number reads a non-negative integer, whatever Go type the decoder chose.
func number(m map[string]any, key string, to *uint64) error {
	v, ok := m[key]
	if !ok || v == nil {
		return nil
	}
	switch n := v.(type) {
	case uint64:
		*to = n
	case int64:
		if n >= 0 {
			*to = uint64(n)
			return nil
		}
		return fmt.Errorf("fw report: %s is %d, want a non-negative integer", key, n)
	case int:
		if n >= 0 {
			*to = uint64(n)
			return nil
		}
		return fmt.Errorf("fw report: %s is %d, want a non-negative integer", key, n)
	case float64:
		if n >= 0 && n == math.Trunc(n) && n < math.MaxUint64 {
			*to = uint64(n)
			return nil
		}
		return fmt.Errorf("fw report: %s is %v, want a non-negative integer", key, n)
	default:
		return fmt.Errorf("fw report: %s is %T, want a number", key, v)
	}
	return nil
}
