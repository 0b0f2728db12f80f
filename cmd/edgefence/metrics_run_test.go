package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// TestRunMetrics: `edgefence run` with metrics.listen serves /metrics,
// /healthz and /readyz on that address. It runs its Go code on one
// processor while the work fits in one (internal/procs), unless GOMAXPROCS
// is in its environment: a second agent, with GOMAXPROCS=2, shows 2.
func TestRunMetrics(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2")
	cfg, sock := e.config("gw-1", 10*time.Second)
	addr := withMetrics(t, cfg)
	p := e.startAgent("gw-1", cfg)
	e.waitHolding(p, sock)
	body := scrapeUntil(t, addr, "edgefence_leases_held 2")
	// metrics.per_device is off by default: fleet-level series only.
	if strings.Contains(body, `device="`) {
		t.Errorf("/metrics has series with a device label without metrics.per_device:\n%s", body)
	}
	for _, want := range []string{`edgefence_devices{state="holding"} 2`, "edgefence_etcd_session_up 1", "edgefence_build_info{"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The governor's one processor (or a one-CPU machine's default). Waited
	// for, not read once: a start busy enough for a look to raise it (this
	// agent is race-built) comes back to one after ten quiet looks.
	scrapeUntil(t, addr, "\ngo_sched_gomaxprocs_threads 1\n")
	if code, body := httpGet(addr, "/healthz"); code != 200 {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := httpGet(addr, "/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	cfg2, _ := e.config("gw-2", 10*time.Second)
	addr2 := withMetrics(t, cfg2)
	if _, err := startProc("gw-2", e, append(subprocEnv(), "GOMAXPROCS=2"), "run", "--config", cfg2); err != nil {
		t.Fatal(err)
	}
	scrapeUntil(t, addr2, "\ngo_sched_gomaxprocs_threads 2\n")
}

// withMetrics adds metrics.listen on a free loopback port to the config
// file at path and returns the address.
func withMetrics(t *testing.T, path string) string {
	t.Helper()
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "metrics:\n  listen: %q\n", addr); err != nil {
		t.Fatal(err)
	}
	return addr
}

// httpGet is GET http://addr+path: the status and the body.
func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrapeUntil reads /metrics at addr until it holds want (30 s at most)
// and returns that scrape.
func scrapeUntil(t *testing.T, addr, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := httpGet(addr, "/metrics")
		if code == 200 && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never held %q: %d %.400s", want, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
