package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// Environment variable names under which the sandbox publishes its
// endpoints (see World.Env and WriteEnvFile).
const (
	EnvEtcd = "EDGEFENCE_ETCD" // e.g. http://127.0.0.1:40123
	EnvMQTT = "EDGEFENCE_MQTT" // e.g. mqtt://127.0.0.1:40125
)

// WorldConfig configures the default world. Dir is required.
type WorldConfig struct {
	Dir      string // root dir; etcd's data goes in Dir/etcd
	Fast     bool   // see EtcdConfig.Fast
	EtcdAddr string // etcd client address; "" = free 127.0.0.1 port
	MQTTAddr string // broker address; "" = free 127.0.0.1 port
	// Auth, if set, makes the broker require credentials (BrokerConfig.Auth).
	Auth   *BrokerAuth
	Logger *slog.Logger
}

// World is the embedded default world: one etcd and one MQTT v5 broker.
type World struct {
	Etcd   *Etcd
	Broker *Broker
}

// StartWorld starts etcd and the broker and returns once both serve. On
// error nothing is left running.
func StartWorld(ctx context.Context, cfg WorldConfig) (*World, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: world: Dir is required")
	}
	etcd, err := StartEtcd(ctx, EtcdConfig{
		Dir:        filepath.Join(cfg.Dir, "etcd"),
		Fast:       cfg.Fast,
		ClientAddr: cfg.EtcdAddr,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	broker, err := StartBroker(BrokerConfig{Addr: cfg.MQTTAddr, Logger: cfg.Logger, Auth: cfg.Auth})
	if err != nil {
		etcd.Close()
		return nil, err
	}
	return &World{Etcd: etcd, Broker: broker}, nil
}

// Env returns the shell-sourceable lines "EDGEFENCE_ETCD=..." and
// "EDGEFENCE_MQTT=...", each ending in a newline.
func (w *World) Env() string {
	return fmt.Sprintf("%s=%s\n%s=%s\n", EnvEtcd, w.Etcd.Endpoint(), EnvMQTT, w.Broker.URL())
}

// WriteEnvFile writes Env to path atomically (a temp file renamed into
// place), so a reader polling for the file never sees half of it.
func (w *World) WriteEnvFile(path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*")
	if err != nil {
		return fmt.Errorf("sandbox: env file: %w", err)
	}
	defer os.Remove(f.Name()) // no-op after the rename
	if _, err := f.WriteString(w.Env()); err != nil {
		f.Close()
		return fmt.Errorf("sandbox: env file: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("sandbox: env file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sandbox: env file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("sandbox: env file: %w", err)
	}
	return nil
}

// Close stops the broker, then etcd. It is idempotent.
func (w *World) Close() error {
	if w == nil {
		return nil
	}
	return errors.Join(w.Broker.Close(), w.Etcd.Close())
}
