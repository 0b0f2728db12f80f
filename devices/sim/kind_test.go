package sim_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/edgefence/edgefence/devices/sim"
)

// An unknown device kind is refused with ErrDeviceKind, and the database
// is not left locked. A shipped build (no edgefence_unsafe) has no unfenced
// kind: there, its name is unknown too.
func TestHostUnknownKind(t *testing.T) {
	path := filepath.Join(t.TempDir(), sim.DBFile)
	kinds := []sim.DeviceKind{"toaster"}
	if !unsafeBuild {
		kinds = append(kinds, "unfenced-thermostat")
	}
	for _, k := range kinds {
		if h, err := sim.OpenHost(path, sim.HostConfig{Kind: k}); !errors.Is(err, sim.ErrDeviceKind) {
			if h != nil {
				h.Close()
			}
			t.Errorf("kind %q: %v, want ErrDeviceKind", k, err)
		}
	}
	openHost(t, path, sim.HostConfig{Kind: sim.DeviceThermostat})
}
