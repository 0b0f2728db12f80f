//go:build !edgefence_unsafe

package main

import (
	"flag"

	"github.com/edgefence/edgefence/devices/sim"
)

// unsafeFlags registers nothing in the shipped simulator: the fence cannot
// be switched off (unsafe.go, -tags edgefence_unsafe, can).
func unsafeFlags(*flag.FlagSet) *bool { return new(bool) }

// deviceKind is the one device kind of a shipped simulator.
func deviceKind(bool) sim.DeviceKind { return sim.DeviceThermostat }
