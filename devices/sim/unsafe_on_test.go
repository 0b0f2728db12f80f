//go:build edgefence_unsafe

package sim_test

const unsafeBuild = true
