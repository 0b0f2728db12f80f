package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// beMain makes the test binary act as edgefence-sandbox, so the tests run
// the real main in a subprocess without a separate build.
const beMain = "EDGEFENCE_SANDBOX_TEST_BE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMain) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"help"}, 0},
		{[]string{"serve", "-h"}, 0},
		{[]string{"bogus"}, 2},
		{[]string{"serve", "--no-such-flag"}, 2},
		{[]string{"serve", "extra"}, 2},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != tc.code {
			t.Errorf("run(%q) = %d, want %d; stderr: %s", tc.args, code, tc.code, errOut.String())
		}
	}
}

func TestServeSubprocess(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "sandbox.env")
	if err := os.WriteFile(envFile, []byte("EDGEFENCE_ETCD=stale\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "serve", "--fast", "--dir", dir, "--env", envFile)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr.String())
		}
	}()

	sc := bufio.NewScanner(stdout)
	var lines []string
	for len(lines) < 2 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 2 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("stdout %q, scan err %v", lines, sc.Err())
	}
	t.Logf("ready after %v:\n%s\n%s", time.Since(start), lines[0], lines[1])
	var info readyInfo
	if err := json.Unmarshal([]byte(lines[1]), &info); err != nil {
		t.Fatalf("JSON line %q: %v", lines[1], err)
	}
	if info.Dir != dir || info.Env != envFile ||
		!strings.HasPrefix(info.Etcd, "http://127.0.0.1:") || !strings.HasPrefix(info.MQTT, "mqtt://127.0.0.1:") {
		t.Fatalf("ready info %+v", info)
	}
	if !strings.Contains(lines[0], info.Etcd) || !strings.Contains(lines[0], info.MQTT) {
		t.Fatalf("words line %q lacks the addresses", lines[0])
	}

	// The env file is written before the ready lines.
	want := "EDGEFENCE_ETCD=" + info.Etcd + "\nEDGEFENCE_MQTT=" + info.MQTT + "\n"
	if b, err := os.ReadFile(envFile); string(b) != want {
		t.Fatalf("env file = %q (%v), want %q", b, err, want)
	}
	for _, raw := range []string{info.Etcd, info.MQTT} {
		u, _ := url.Parse(raw)
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			t.Fatalf("%s not accepting: %v", raw, err)
		}
		c.Close()
	}

	stopAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	t.Logf("exited cleanly %v after SIGTERM", time.Since(stopAt))
	if _, err := os.Stat(envFile); !os.IsNotExist(err) {
		t.Fatalf("env file left after exit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd", "member")); err != nil {
		t.Fatalf("--dir data not kept: %v", err)
	}
}
