package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// demoTestOptions builds the binaries for a demo test (skipped with
// -short) and returns the demo's options, its work dir a temp dir.
func demoTestOptions(t *testing.T) demoOptions {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	bin := t.TempDir()
	if err := sandbox.BuildCommands(t.Context(), bin, false, "edgefence", "edgefence-devsim"); err != nil {
		t.Fatal(err)
	}
	return demoOptions{agentBin: filepath.Join(bin, "edgefence"), devsimBin: filepath.Join(bin, "edgefence-devsim"), dir: t.TempDir()}
}

// TestDemo runs the demo, every scene and its contrast, on binaries built
// for the test, and checks what each scene came to, not only that it ran:
// the MQTT devices keep B's setpoint and refuse the forgery, and without
// the fence hold the stale 99; the PLC on the RS-485 line (edgefence-devsim
// --modbus-rtu, the Go slave: no pymodbus, no mbpoll) keeps B's 250 in its
// register, A's late write answered stale by B's fence table and never
// applied, while with B's table off the PLC applies it and holds 990.
func TestDemo(t *testing.T) {
	o := demoTestOptions(t)
	o.contrast = true
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	run, err := runDemo(ctx, o, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("demo output:\n%s", out.String())

	if err := run.Fenced.CheckFenced(); err != nil || run.Fenced.Forgery == nil {
		t.Errorf("MQTT scene: %v (forgery %+v)", err, run.Fenced.Forgery)
	}
	if run.Unfenced == nil || run.Unfenced.Corrupted() != len(run.Unfenced.Values) {
		t.Errorf("MQTT contrast: want every device at the stale 99: %+v", run.Unfenced)
	}

	b, late := uint16(sandbox.SetpointB*10), uint16(sandbox.SetpointLate*10)
	p := run.PLC
	if p == nil {
		t.Fatal("the PLC scene did not run")
	}
	if v := p.Late[plcDevice]; v.Verdict != "stale" {
		t.Errorf("PLC scene: A's late command %+v, want stale from B's fence table", v)
	}
	if w := plcWrites(p); !slices.Equal(p.Registers, []uint16{b}) || len(w) == 0 || w[len(w)-1] != b || slices.Contains(w, late) {
		t.Errorf("PLC scene: register 0 holds %v, the PLC applied %v; want B's %d last and never %d", p.Registers, w, b, late)
	}
	for _, want := range []string{"B's fence table refused A's late write (stale) before the bus; register 0 keeps B's 250",
		"A's 990 never reached the line", "without B's table: A's late write went onto the line"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo does not say %q", want)
		}
	}

	u := run.PLCUnfenced
	if u == nil {
		t.Fatal("the PLC contrast did not run")
	}
	if v := u.Late[plcDevice]; v.Verdict != "accepted" || !slices.Equal(u.Registers, []uint16{late}) || !slices.Contains(plcWrites(u), late) {
		t.Errorf("PLC contrast: A's late command %+v, register 0 holds %v, applied %v; want %d applied and held", v, u.Registers, plcWrites(u), late)
	}
}
