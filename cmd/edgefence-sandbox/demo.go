package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// demo replays Figure 1 of the fencing article on real parts and narrates
// it; `demo firmware` runs the firmware failover demo instead (demofw.go).
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "[flags]", stderr)
	binDir := fs.String("bin", "", "directory holding the edgefence and edgefence-devsim binaries (default: next to this program)")
	contrast := fs.Bool("contrast", true, "after each scene, run the same schedule with the fence switched off")
	keep := fs.Bool("keep", false, "keep the work dir (configs, logs, verdict logs) and print its path")
	firmware := len(args) > 0 && args[0] == "firmware"
	if firmware {
		args = args[1:] // demo firmware [flags]: the firmware failover demo
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected %q (the one scene name is firmware, first)\n", fs.Arg(0))
		return errUsage
	}
	agentBin, devsimBin, err := demoBinaries(*binDir)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "edgefence-demo-")
	if err != nil {
		return err
	}
	if *keep {
		defer fmt.Fprintf(stdout, "\nwork dir kept: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	o := demoOptions{agentBin: agentBin, devsimBin: devsimBin, dir: dir, contrast: *contrast}
	if firmware {
		_, err = demoFirmware(ctx, o, stdout, stderr)
		return err
	}
	_, err = runDemo(ctx, o, stdout, stderr)
	return err
}

// demoOptions are the demo's inputs: the binaries it runs, its work dir,
// and whether it runs each scene again without the fence.
type demoOptions struct {
	agentBin, devsimBin, dir string
	contrast                 bool
}

// demoRun is what the demo's runs came to (nil: not run).
type demoRun struct {
	Fenced, Unfenced *sandbox.Figure1Result // MQTT devices with their own fence
	PLC, PLCUnfenced *sandbox.Figure1Result // the PLC on an RS-485 line behind gateway B
}

// runDemo runs the demo's scenes in o.dir, narrating them to stdout.
func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) (*demoRun, error) {
	start, dir := time.Now(), o.dir
	w, auth, err := startDemoWorld(ctx, dir, stderr)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	fmt.Fprintf(stdout, "edgefence demo — Figure 1 of \"Distributed Locks Fencing Tokens\", on real parts:\n")
	fmt.Fprintf(stdout, "  etcd %s (embedded, single node), MQTT v5 broker %s (mochi, with passwords and an ACL), devices: edgefence-devsim with the shim\n", w.Etcd.Endpoint(), w.Broker.URL())
	// The operator's trust chain, made here: a root key, and a signing key
	// and certificate per gateway (Figure1Config.Trust).
	trust, err := sandbox.NewTrustKit(filepath.Join(dir, "trust"))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "  commands signed (ES256, COSE): the operator's root key and the gateways' certified keys are in %s\n\n", trust.Dir)

	base := sandbox.Figure1Config{AgentBin: o.agentBin, DevsimBin: o.devsimBin, Etcd: w.Etcd.Endpoint(), MQTT: w.Broker.URL(), Narrate: stdout, Auth: auth}
	cfg := base
	cfg.Trust, cfg.Forgery = trust, true
	cfg.Dir = filepath.Join(dir, "fenced")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	run := &demoRun{}
	if run.Fenced, err = sandbox.RunFigure1(ctx, cfg); err != nil {
		return nil, err
	}
	if err := run.Fenced.CheckFenced(); err != nil {
		return nil, fmt.Errorf("the fence did not hold: %w", err)
	}
	fmt.Fprintf(stdout, "\n=> with the fence: every late command of the frozen holder was refused as stale; B's value stands.\n")
	if f := run.Fenced.Forgery; f != nil {
		fmt.Fprintf(stdout, "=> the unsigned forgery with token 2^63 was refused %s at %s, its mark unchanged (token %d seq %d); B's next command was %s.\n",
			f.Verdict, f.Device, f.After.Token, f.After.Seq, f.Next.Verdict)
	}

	if o.contrast {
		if run.Unfenced, err = demoContrast(ctx, cfg, dir, stdout); err != nil {
			return nil, err
		}
	}
	if err := demoPLC(ctx, base, dir, o.contrast, stdout, run); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "\ndemo finished in %.1fs\n", time.Since(start).Seconds())
	return run, nil
}

// startDemoWorld starts the demo's etcd and broker in dir/world. The
// broker requires credentials: each agent and the device simulator log in
// as their own user (Figure1Config.Auth adds them).
func startDemoWorld(ctx context.Context, dir string, stderr io.Writer) (*sandbox.World, *sandbox.BrokerAuth, error) {
	auth, err := sandbox.NewBrokerAuth("")
	if err != nil {
		return nil, nil, err
	}
	w, err := sandbox.StartWorld(ctx, sandbox.WorldConfig{Dir: filepath.Join(dir, "world"), Fast: true, Auth: auth,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return nil, nil, err
	}
	return w, auth, nil
}

// demoContrast runs cfg's schedule again with the fence switched off (a
// lease alone, unfenced devices that check nothing) and says what it cost.
func demoContrast(ctx context.Context, cfg sandbox.Figure1Config, dir string, stdout io.Writer) (*sandbox.Figure1Result, error) {
	fmt.Fprintf(stdout, "\nThe same schedule with the fence switched off (a lease alone):\n\n")
	cfg.Dir = filepath.Join(dir, "unfenced")
	cfg.NoFence = true
	cfg.Trust, cfg.Forgery = nil, false // unfenced devices check nothing
	cfg.EtcdPrefix, cfg.MQTTPrefix = "/edgefence/unfenced", "edgefence/unfenced"
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	res, err := sandbox.RunFigure1(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if n := res.Corrupted(); n > 0 {
		fmt.Fprintf(stdout, "\n=> without the fence: %d of %d devices ended with the stale holder's setpoint %g, overwriting B's %g.\n",
			n, len(res.Values), sandbox.SetpointLate, sandbox.SetpointB)
	} else {
		fmt.Fprintf(stdout, "\n=> without the fence the late commands did not land this time (the agent noticed first)\n")
	}
	return res, nil
}

// demoBinaries returns the agent and devsim binaries in binDir (default:
// beside this program), or an error naming the one missing.
func demoBinaries(binDir string) (agentBin, devsimBin string, err error) {
	if binDir == "" {
		self, err := os.Executable()
		if err != nil {
			return "", "", err
		}
		binDir = filepath.Dir(self)
	}
	agentBin, devsimBin = filepath.Join(binDir, "edgefence"), filepath.Join(binDir, "edgefence-devsim")
	for _, b := range []string{agentBin, devsimBin} {
		if _, err := os.Stat(b); err != nil {
			return "", "", fmt.Errorf("%w (build with `make build`, or pass --bin)", err)
		}
	}
	return agentBin, devsimBin, nil
}
