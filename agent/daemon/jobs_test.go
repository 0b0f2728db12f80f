package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/images"
	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/shadow"
)

// TestDaemonRunsFirmwareJob: the daemon's wiring of firmware jobs (jobs
// on by default): the Store on its etcd client, the image cache under
// <state_dir>/images filled from a file URL, the devices' state reports to
// the runner. A devsim firmware device (rebooted in process when it asks)
// ends committed on the image and the execution succeeded.
func TestDaemonRunsFirmwareJob(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	cfg := w.config(t, dir)
	cfg.Devices = []agent.DeviceConfig{{ID: "fw-1", Auth: agent.AuthOff}}
	img, err := sim.FirmwareImage(40<<10, sim.VersionMarker+"2.0.0")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fw-2.0.0.bin")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(img)
	ref := jobs.ImageRef{SHA256: hex.EncodeToString(sum[:]), Size: uint64(len(img)), Version: 2, URL: images.FileURL(path)}

	ctx, cancel := context.WithCancel(t.Context())
	devDone := runFirmwareDevice(ctx, t, sim.FirmwareConfig{Device: "fw-1", Dir: t.TempDir(), Broker: w.broker.URL()})
	d, err := New(t.Context(), cfg, Options{Notify: func(string) error { return nil }})
	if err != nil {
		cancel()
		<-devDone
		t.Fatal(err)
	}
	stop := runDaemon(t, d)
	defer func() {
		stop()
		cancel()
		<-devDone
	}()

	store := jobs.NewStore(w.cli, agent.DefaultEtcdPrefix)
	job := jobs.Job{ID: "daemon-fw", Image: ref, Targets: jobs.Targets{Devices: []string{"fw-1"}},
		Timeout: jobs.Timeouts{Step: jobs.Duration(30 * time.Second), Reboot: jobs.Duration(30 * time.Second)}}
	if _, _, err := store.Create(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	var e jobs.Execution
	for deadline := time.Now().Add(2 * time.Minute); !e.Status.Terminal(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("execution not ended after 2 minutes: %+v", e)
		}
		if e, err = store.Execution(t.Context(), "fw-1", job.ID); err != nil {
			t.Fatal(err)
		}
	}
	if e.Status != jobs.Succeeded || e.Gateway != "gw-1" {
		t.Fatalf("execution %+v", e)
	}
	if _, err := os.Stat(filepath.Join(dir, agent.JobsCacheDir, "sha256", ref.SHA256)); err != nil {
		t.Errorf("the image is not in the cache: %v", err)
	}
	st, ok := d.Agent().JobStats()
	if !ok || st.Ended[jobs.Succeeded] != 1 || st.ImageBytes != ref.Size {
		t.Errorf("job stats %+v", st)
	}
	// Twins are off (the default): the device's state reports (one per
	// command, every chunk's included) drove the job from memory and
	// never became a reported write in etcd (issue 17: a fenced etcd Txn
	// per report when jobs turned the twin store on).
	if tw := d.Agent().Status().Twins; tw != nil {
		t.Errorf("twins off, jobs on: the twin reconciler runs: %+v", *tw)
	}
	key := shadow.NewStore(w.cli, shadow.StoreConfig{Prefix: agent.DefaultEtcdPrefix}).ReportedKey("fw-1")
	if resp, err := w.cli.Get(t.Context(), key, clientv3.WithCountOnly()); err != nil {
		t.Error(err)
	} else if resp.Count != 0 {
		t.Errorf("twins off: the device's state reports were written to %s in etcd", key)
	}
	// The reports are still read (for the runner): their malformed count
	// is still served.
	rec := httptest.NewRecorder()
	d.Agent().MetricsHandler("test").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if m := rec.Body.String(); !strings.Contains(m, "\nedgefence_state_reports_malformed_total 0\n") {
		t.Errorf("jobs on, twins off: /metrics lacks edgefence_state_reports_malformed_total")
	}
}

// runFirmwareDevice runs a devsim firmware device until ctx ends,
// restarting it on its directory whenever it asks for a reboot (the
// process exit and start edgefence-devsim --firmware does). The channel
// closes when it has stopped.
func runFirmwareDevice(ctx context.Context, t *testing.T, cfg sim.FirmwareConfig) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			dev, err := sim.StartFirmware(ctx, cfg)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("firmware device: %v", err)
				}
				return
			}
			if err := dev.AwaitReady(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("firmware device ready: %v", err)
			}
			select {
			case <-ctx.Done():
			case <-dev.RebootRequested():
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := dev.Close(cctx); err != nil {
				t.Errorf("firmware device close: %v", err)
			}
			cancel()
		}
	}()
	return done
}

// runDaemon runs d until the returned stop is called; stop waits for Run
// and fails the test if it returned an error.
func runDaemon(t *testing.T, d *Daemon) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestDaemonSmallImageCache: a jobs.cache_max_bytes below the default
// bound of one image (256 MiB) starts, and bounds its images instead: an
// image larger than the cache is refused by size, one that fits is
// served.
func TestDaemonSmallImageCache(t *testing.T) {
	w := newWorld(t)
	cfg := w.config(t, t.TempDir())
	cfg.Jobs.CacheMaxBytes = 1 << 20
	d, err := New(t.Context(), cfg, Options{Notify: func(string) error { return nil }})
	if err != nil {
		t.Fatalf("a 1 MiB image cache: %v", err)
	}
	defer d.Close()
	put := func(n int) (images.Ref, error) {
		img := make([]byte, n)
		path := filepath.Join(t.TempDir(), "img")
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(img)
		ref := images.Ref{SHA256: sum[:], Size: uint64(n), URL: images.FileURL(path)}
		im, err := d.images.Get(t.Context(), ref)
		if err == nil {
			im.Close()
		}
		return ref, err
	}
	if _, err := put(2 << 20); err == nil {
		t.Error("an image of 2 MiB in a 1 MiB cache: served")
	}
	if _, err := put(512 << 10); err != nil {
		t.Errorf("an image of 512 KiB in a 1 MiB cache: %v", err)
	}
}
