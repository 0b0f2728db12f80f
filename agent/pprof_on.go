//go:build edgefence_pprof

package agent

import (
	"net/http"
	"net/http/pprof"
)

// pprofBuild: this build can serve Go's profiler (metrics.pprof). A
// profiling build only: net/http/pprof adds about 0.3 MB to the agent,
// which the shipped arm64 binary's 16 MB budget (TestBinarySize) does
// not leave room for.
const pprofBuild = true

// servePprof serves Go's profiler under /debug/pprof/ on mux.
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
