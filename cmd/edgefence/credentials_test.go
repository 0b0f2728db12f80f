package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/internal/mochiquota"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// authBroker starts a mochi broker that admits only user with password.
func authBroker(t *testing.T, user, password string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := srv.AddHook(new(auth.Hook), &auth.Options{Ledger: &auth.Ledger{Auth: auth.AuthRules{
		{Username: auth.RString(user), Password: auth.RString(password), Allow: true},
	}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := mochiquota.Add(srv); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "auth", Address: addr})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return "mqtt://" + addr
}

// The agent authenticates to etcd (auth enabled, root user) and to an
// MQTT broker that checks passwords, with both passwords from systemd's
// credentials directory; `config check` says where they come from and
// never prints them. A wrong MQTT password is refused by the broker.
func TestRunCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{Dir: filepath.Join(dir, "world"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	cli, err := w.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const etcdPW, mqttPW = "etcd-Pa55", "mqtt-Pa55"
	if _, err := cli.UserAdd(ctx, "root", etcdPW); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	broker := authBroker(t, "gw", mqttPW)

	creds := filepath.Join(dir, "credentials")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"etcd_password": etcdPW + "\n", "mqtt_password": mqttPW + "\n"} {
		if err := os.WriteFile(filepath.Join(creds, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	config := func(gateway string) (path, socket string) {
		c := w.AgentConfig(gateway, dir, []string{"dev-1"})
		c.MQTT, c.LogFormat = broker, "json"
		b, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		// bcrypt under -race on a busy machine: give authentication time.
		s := strings.Replace(string(b), "etcd:\n", "etcd:\n  username: root\n  dial_timeout: 20s\n", 1)
		s = strings.Replace(s, "mqtt:\n", "mqtt:\n  username: gw\n", 1)
		path = filepath.Join(dir, gateway+".yaml")
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return path, c.Socket
	}
	start := func(name, path string, env ...string) *sandbox.Proc {
		p, err := sandbox.StartProc(name, filepath.Join(dir, name+".log"), append(subprocEnv(), env...), os.Args[0], "run", "--config", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(10 * time.Second); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
		return p
	}

	cfg1, sock1 := config("gw-1")
	credEnv := "CREDENTIALS_DIRECTORY=" + creds
	r := edgefence(t, "config", "check", cfg1) // no credentials here
	if r.code != 0 || !strings.Contains(r.stdout, "password: \"\"") {
		t.Fatalf("config check without credentials\n%s", r)
	}
	p := start("gw-1", cfg1, credEnv)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, r := status(t, sock1)
		if st != nil && st.Devices[0].State == agent.StateHolding && st.Transport["connected"] == true {
			break // etcd and the broker both took our credentials
		}
		select {
		case <-p.Done():
			b, _ := os.ReadFile(filepath.Join(dir, "gw-1.log"))
			t.Fatalf("agent exited\n%s\nlog:\n%s", r, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent does not hold dev-1 with a connected broker\n%s", r)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A wrong MQTT password (the environment wins over the credentials
	// directory): the broker refuses it, and says so in the agent's log.
	cfg2, sock2 := config("gw-2")
	p2 := start("gw-2", cfg2, credEnv, agent.EnvMQTTPassword+"=not-the-Pa55")
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	if err := p2.WaitLine(lctx, "server denied connect"); err != nil {
		t.Fatalf("no refusal logged: %v", err)
	}
	if st, r := status(t, sock2); st == nil || st.Transport["connected"] != false || !st.Etcd.Session {
		t.Fatalf("gw-2 with a wrong MQTT password: want an etcd session and no broker\n%s", r)
	}
	// A wrong etcd password: run fails at once and says which setting.
	cfg3, _ := config("gw-3")
	t.Setenv(agent.EnvEtcdPassword, "not-the-Pa55")
	r = edgefence(t, "run", "--config", cfg3)
	if r.code != 1 || !strings.Contains(r.stderr, "authentication failed") || !strings.Contains(r.stderr, "etcd.password") {
		t.Fatalf("run with a wrong etcd password: want exit 1 naming etcd.password\n%s", r)
	}
	r = edgefence(t, "config", "check", "--json", cfg3)
	if r.code != 0 || !strings.Contains(r.stdout, `"password": "<from env EDGEFENCE_ETCD_PASSWORD>"`) || strings.Contains(r.stdout, "not-the-Pa55") {
		t.Fatalf("config check with the password in the environment\n%s", r)
	}

	for _, log := range []string{filepath.Join(dir, "gw-1.log"), filepath.Join(dir, "gw-2.log")} {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), etcdPW) || strings.Contains(string(b), mqttPW) || strings.Contains(string(b), "not-the-Pa55") {
			t.Errorf("%s logs a secret:\n%s", log, b)
		}
	}
}
