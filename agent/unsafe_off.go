//go:build !edgefence_unsafe

package agent

// unsafeBuild: a shipped build; see unsafe.go.
const unsafeBuild = false
