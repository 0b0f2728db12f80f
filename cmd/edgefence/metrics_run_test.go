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
// /healthz and /readyz on that address.
func TestRunMetrics(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2")
	cfg, sock := e.config("gw-1", 10*time.Second)
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(f, "metrics:\n  listen: %q\n", addr); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := e.startAgent("gw-1", cfg)
	e.waitHolding(p, sock)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("/metrics")
		if code == 200 && strings.Contains(body, "edgefence_leases_held 2") {
			// metrics.per_device is off by default: fleet-level series only.
			if strings.Contains(body, `device="`) {
				t.Errorf("/metrics has series with a device label without metrics.per_device:\n%s", body)
			}
			for _, want := range []string{`edgefence_devices{state="holding"} 2`, "edgefence_etcd_session_up 1", "edgefence_build_info{"} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics: %d %.400s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		code, body := get("/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
