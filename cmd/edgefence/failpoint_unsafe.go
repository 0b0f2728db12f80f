//go:build edgefence_unsafe

package main

import (
	"os"
	"slices"
	"strings"
)

// failpointsEnv holds the failpoints of a test or demo build, a comma list:
// EDGEFENCE_FAILPOINTS=ignore-session-loss runs the agent as a frozen
// process that never notices it was deposed (invariant I6 off), so tests and
// the demo show the fence points keep I1 alone; no-fence-table runs the
// bridge without its table. Only a build with -tags edgefence_unsafe reads
// it (`make build`, the tests' binaries); the shipped binary has neither the
// variable nor this function (TestShippedBinaryHasNoFailpoints).
const failpointsEnv = "EDGEFENCE_FAILPOINTS"

// failpoint reports whether the named failpoint is set. noinline keeps its
// symbol in a test build, where TestShippedBinaryHasNoFailpoints's control
// looks for it.
//
//go:noinline
func failpoint(name string) bool {
	return slices.Contains(strings.Split(os.Getenv(failpointsEnv), ","), name)
}
