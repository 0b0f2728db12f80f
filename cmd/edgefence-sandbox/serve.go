package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/edgefence/edgefence/devices/sandbox"
)

// serve runs the default world until ctx is done.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "data dir (default: a new temp dir, removed on exit)")
	fast := fs.Bool("fast", false, "fast etcd timing (tick 10 ms, election 100 ms): honours 1–2 s lease TTLs")
	etcdAddr := fs.String("etcd-addr", "", "etcd client address HOST:PORT (default: a free 127.0.0.1 port)")
	mqttAddr := fs.String("mqtt-addr", "", "MQTT broker address HOST:PORT (default: a free 127.0.0.1 port)")
	envFile := fs.String("env", "", "once ready, write EDGEFENCE_ETCD=... and EDGEFENCE_MQTT=... to this file (removed on exit)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q\n", fs.Args())
		return errUsage
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if *dir == "" {
		d, err := os.MkdirTemp("", "edgefence-sandbox-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	if *envFile != "" {
		// A stale file from an earlier run must not look like readiness.
		if err := os.Remove(*envFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}

	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{
		Dir:      *dir,
		Fast:     *fast,
		EtcdAddr: *etcdAddr,
		MQTTAddr: *mqttAddr,
		Logger:   log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return err
	}
	defer func() {
		log.Info("stopping")
		if err := w.Close(); err != nil {
			log.Error("stop", "err", err)
		}
		log.Info("stopped")
	}()

	if *envFile != "" {
		if err := w.WriteEnvFile(*envFile); err != nil {
			return err
		}
		defer os.Remove(*envFile)
		log.Info("wrote env file", "path", *envFile)
	}
	// The env file exists by the time anyone reads these lines.
	fmt.Fprintf(stdout, "edgefence sandbox ready: etcd at %s, MQTT v5 broker at %s, data in %s\n",
		w.Etcd.Endpoint(), w.Broker.URL(), *dir)
	line, err := json.Marshal(readyInfo{Etcd: w.Etcd.Endpoint(), MQTT: w.Broker.URL(), Dir: *dir, Env: *envFile})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", line)

	log.Info("ready; interrupt to stop", "etcd", w.Etcd.Endpoint(), "mqtt", w.Broker.URL(), "fast", *fast)

	<-ctx.Done()
	return nil
}

// readyInfo is the JSON line serve prints once both servers are up.
type readyInfo struct {
	Etcd string `json:"etcd"`
	MQTT string `json:"mqtt"`
	Dir  string `json:"dir"`
	Env  string `json:"env,omitempty"`
}
