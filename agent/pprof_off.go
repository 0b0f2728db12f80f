//go:build !edgefence_pprof

package agent

import "net/http"

// pprofBuild: a shipped build has no profiler; metrics.pprof is a config
// error here (build with -tags edgefence_pprof; see pprof_on.go).
const pprofBuild = false

func servePprof(*http.ServeMux) {}
