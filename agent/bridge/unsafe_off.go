//go:build !edgefence_unsafe

package bridge

// unsafeBuild: a shipped build; NoTable refuses.
const unsafeBuild = false
