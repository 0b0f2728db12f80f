//go:build edgefence_unsafe

package agent

// unsafeBuild: this is a test or demo build; see unsafe.go.
const unsafeBuild = true
