// Command edgefence-chaos runs randomized fault-injection rounds against
// the real binaries (package internal/sandbox/chaos) and prints a summary:
// rounds, faults injected per kind, commands created and their terminal
// states, and invariant violations, which must be 0.
//
//	edgefence-chaos --rounds 300 --bin bin/
//	edgefence-chaos --rounds 20 --bin bin/ --c-device bin/efsdev --scenarios kill-devsim,holder-sigstop
//
// With --c-device the shim devices are the C device (devices/firmware/linux,
// `make efsdev`) instead of edgefence-devsim. Rounds run signed (an
// operator root, a certificate per gateway, every device `auth:
// required`); --unsigned runs them with plain envelopes, without the
// trust scenarios.
//
// It exits 1 if any round found a violation or could not finish. `make
// chaos ROUNDS=N` builds the binaries and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/internal/sandbox/chaos"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	c, code, ok := parseArgs(args, stderr)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var sum chaos.Summary
	fmt.Fprintf(stdout, "%-6s %-29s %-20s %8s %8s %6s %6s %6s %6s %5s  %s\n",
		"round", "scenario", "seed", "created", "accepted", "dup", "stale", "inval", "expir", "viol", "time")
	for i := range c.rounds {
		if ctx.Err() != nil {
			break
		}
		c.round(ctx, i, &sum, stdout)
	}
	fmt.Fprintln(stdout)
	sum.Print(stdout)
	if c.keep {
		fmt.Fprintf(stdout, "round files kept in %s\n", c.work)
	} else {
		os.RemoveAll(c.work)
	}
	if sum.Violations > 0 || sum.Failed > 0 {
		return 1
	}
	return 0
}

// chaosRun is what one invocation runs, from its flags.
type chaosRun struct {
	rounds    int
	scenarios []string
	bin       string // absolute
	work      string // the rounds' files, in round-NNNN-SCENARIO
	keep      bool   // keep work: given with --dir, or a round failed
	seed      uint64 // of round 0
	devices   int
	cdevice   string // the C device's binary, absolute; "" for devsim
	load      time.Duration
	unsigned  bool
	log       *slog.Logger
}

// parseArgs parses and checks the flags and makes the working directory.
// With ok false the command is to exit with code: 0 after -h, 2 on a
// usage error (reported on stderr).
func parseArgs(args []string, stderr io.Writer) (c *chaosRun, code int, ok bool) {
	fs := flag.NewFlagSet("edgefence-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c = &chaosRun{}
	fs.IntVar(&c.rounds, "rounds", 10, "number of randomized rounds")
	bin := fs.String("bin", "bin", "directory with the edgefence, edgefence-devsim and edgefence-sandbox binaries")
	fs.StringVar(&c.work, "dir", "", "working directory (default: a temporary one, removed unless a round fails)")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the first round (default: from the clock); round i uses seed+i")
	only := fs.String("scenarios", "", "comma-separated scenarios to draw from (default all; with --unsigned all but "+
		"gateway-revoked and key-rotated)")
	fs.BoolVar(&c.unsigned, "unsigned", false, "run the rounds unsigned: plain envelopes, devices auth: off")
	fs.IntVar(&c.devices, "devices", 4, "shim devices per round")
	fs.DurationVar(&c.load, "load", 6*time.Second, "how long commands flow in a round")
	cdev := fs.String("c-device", "", "the C device's binary (efsdev, `make efsdev`): it serves the shim devices instead of edgefence-devsim")
	verbose := fs.Bool("v", false, "narrate each round")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, 2, false
	}
	have := chaos.Scenarios()
	if c.unsigned {
		have = chaos.UnsignedScenarios()
	}
	c.scenarios = have
	if *only != "" {
		c.scenarios = strings.Split(*only, ",")
	}
	for _, s := range c.scenarios {
		if !contains(have, s) {
			fmt.Fprintf(stderr, "edgefence-chaos: unknown scenario %q (have %s)\n", s, strings.Join(have, ", "))
			return nil, 2, false
		}
	}
	for _, b := range []string{"edgefence", "edgefence-devsim", "edgefence-sandbox"} {
		if _, err := os.Stat(filepath.Join(*bin, b)); err != nil {
			fmt.Fprintf(stderr, "edgefence-chaos: %v (run `make build` or give --bin)\n", err)
			return nil, 2, false
		}
	}
	var err error
	if *cdev != "" {
		if c.cdevice, err = filepath.Abs(*cdev); err == nil {
			_, err = os.Stat(c.cdevice)
		}
		if err != nil {
			fmt.Fprintf(stderr, "edgefence-chaos: --c-device: %v\n", err)
			return nil, 2, false
		}
	}
	if c.bin, err = filepath.Abs(*bin); err != nil {
		fmt.Fprintln(stderr, "edgefence-chaos:", err)
		return nil, 2, false
	}
	c.keep = c.work != ""
	if c.work == "" {
		if c.work, err = os.MkdirTemp("", "edgefence-chaos-"); err != nil {
			fmt.Fprintln(stderr, "edgefence-chaos:", err)
			return nil, 2, false
		}
	}
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano())
	}
	c.log = slog.New(slog.DiscardHandler)
	if *verbose {
		c.log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	return c, 0, true
}

// round runs round i, adds it to sum and prints its line (and its report
// if it failed). Its files are removed unless it failed or an earlier one
// did, or the working directory was given.
func (c *chaosRun) round(ctx context.Context, i int, sum *chaos.Summary, stdout io.Writer) {
	sc := c.scenarios[int((c.seed+uint64(i))%uint64(len(c.scenarios)))]
	rdir := filepath.Join(c.work, fmt.Sprintf("round-%04d-%s", i, sc))
	cfg := chaos.Config{Bin: c.bin, Dir: rdir, Seed: c.seed + uint64(i), Devices: c.devices, Load: c.load, Logger: c.log,
		CDeviceBin: c.cdevice, Unsigned: c.unsigned}
	res, err := chaos.Run(ctx, cfg, sc)
	sum.Add(res, err)
	switch {
	case err != nil:
		fmt.Fprintf(stdout, "%-6d %-29s %-20d error: %v\n", i, sc, cfg.Seed, err)
		c.keep = true
	default:
		t := res.Report.Terminal
		fmt.Fprintf(stdout, "%-6d %-29s %-20d %8d %8d %6d %6d %6d %6d %5d  %v\n", i, sc, cfg.Seed, res.Report.Created,
			t["accepted"], t["duplicate"], t["stale"], t["invalid"], t["expired"], len(res.Report.Violations), res.Elapsed.Round(100*time.Millisecond))
		if !res.OK() {
			c.keep = true
			fmt.Fprint(stdout, res.Report.String())
		} else if !c.keep {
			os.RemoveAll(rdir)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
