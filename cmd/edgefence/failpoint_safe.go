//go:build !edgefence_unsafe

package main

// failpoint is always off in the shipped binary: the failpoints exist only
// in a build with -tags edgefence_unsafe (failpoint_unsafe.go).
func failpoint(string) bool { return false }
