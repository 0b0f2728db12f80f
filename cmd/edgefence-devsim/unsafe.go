//go:build edgefence_unsafe

package main

import (
	"flag"

	"github.com/edgefence/edgefence/devices/sim"
)

// unsafeFlags registers the switches of a test or demo build (-tags
// edgefence_unsafe: `make build`, the tests' binaries) and returns
// --unsafe-no-fence. The shipped simulator has no such flag. noinline keeps
// the symbol that TestShippedBinaryHasNoFailpoints's control looks for.
//
//go:noinline
func unsafeFlags(fs *flag.FlagSet) *bool {
	return fs.Bool("unsafe-no-fence", false, "run unfenced devices (sim.DeviceUnfenced): they apply stale and duplicate commands (test and demo builds only)")
}

// deviceKind is the kind of device the fleet runs: unfenced thermostats
// with --unsafe-no-fence.
func deviceKind(noFence bool) sim.DeviceKind {
	if noFence {
		return sim.DeviceUnfenced
	}
	return sim.DeviceThermostat
}
