//go:build !edgefence_unsafe

package main

import "flag"

// unsafeFlags registers nothing in the shipped simulator: the fence cannot
// be switched off (unsafe.go, -tags edgefence_unsafe, can).
func unsafeFlags(*flag.FlagSet) *bool { return new(bool) }
