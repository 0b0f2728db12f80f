package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/shadow"
)

// The real binary with `twins: {enabled: true}`: a desired state written to
// etcd reaches the simulated thermostat as a fenced twin.set, and the
// agent writes reported under its token.
func TestRunTwins(t *testing.T) {
	e := newEnv(t, "dev-1")
	cfg, sock := e.config("gw-1", 10*time.Second)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("twins:\n  enabled: true\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := e.startAgent("gw-1", cfg)
	st := e.waitHolding(p, sock)
	token := st.Devices[0].Token

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	app := shadow.NewStore(e.etcd, shadow.StoreConfig{Prefix: agent.DefaultEtcdPrefix, Writer: "app"})
	want := map[string]any{"setpoint": 24, "mode": "cool"}
	if _, err := app.UpdateDesired(ctx, "dev-1", want, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var doc *shadow.Document
	for {
		doc, err = app.Get(ctx, "dev-1")
		if err == nil && len(doc.Delta) == 0 && len(doc.Reported.Fields) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("twin does not converge: %+v %v", doc, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := doc.Reported.Meta["/setpoint"]; m.By != "gw-1" || m.Token != int64(token) {
		t.Fatalf("reported setpoint meta %+v, want gw-1 under token %d", m, token)
	}
	if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 24 || s.Mode != "cool" {
		t.Fatalf("device state %+v, %v", s, err)
	}
	// The device's state report (MQTT state topic) reaches reported too.
	for {
		rep, err := app.GetReported(ctx, "dev-1")
		if err == nil && rep.Fields["last_token"] == float64(token) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("device state report not in reported: %+v %v", rep, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// status text shows the twin counters in one line.
	r := edgefence(t, "status", "--socket", sock)
	if r.code != 0 || !strings.Contains(r.stdout, "twins watching desired: ") || !strings.Contains(r.stdout, "twin.set sent") {
		t.Errorf("status text lacks the twin counters\n%s", r)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "gw-1-state", shadow.CacheFile)); err != nil {
		t.Fatalf("twin cache: %v", err)
	}
}
