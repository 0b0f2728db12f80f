//go:build edgefence_unsafe

package main

import "flag"

// unsafeFlags registers the switches of a test or demo build (-tags
// edgefence_unsafe: `make build`, the tests' binaries) and returns
// --unsafe-no-fence. The shipped simulator has no such flag. noinline keeps
// the symbol that TestShippedBinaryHasNoFailpoints's control looks for.
//
//go:noinline
func unsafeFlags(fs *flag.FlagSet) *bool {
	return fs.Bool("unsafe-no-fence", false, "DISABLE THE FENCE: apply stale and duplicate commands (test and demo builds only)")
}
