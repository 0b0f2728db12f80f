//go:build edgefence_unsafe

package bridge

// unsafeBuild: a test or demo build (NoTable).
const unsafeBuild = true
