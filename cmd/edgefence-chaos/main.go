// Command edgefence-chaos runs randomized fault-injection rounds against
// the real binaries (package devices/sandbox/chaos) and prints a summary:
// rounds, faults injected per kind, commands created and their terminal
// states, and invariant violations, which must be 0.
//
//	edgefence-chaos --rounds 300 --bin bin/
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

	"github.com/edgefence/edgefence/devices/sandbox/chaos"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edgefence-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rounds := fs.Int("rounds", 10, "number of randomized rounds")
	bin := fs.String("bin", "bin", "directory with the edgefence, edgefence-devsim and edgefence-sandbox binaries")
	dir := fs.String("dir", "", "working directory (default: a temporary one, removed unless a round fails)")
	seed := fs.Uint64("seed", 0, "seed of the first round (default: from the clock); round i uses seed+i")
	only := fs.String("scenarios", strings.Join(chaos.Scenarios(), ","), "comma-separated scenarios to draw from")
	devices := fs.Int("devices", 4, "shim devices per round")
	load := fs.Duration("load", 6*time.Second, "how long commands flow in a round")
	verbose := fs.Bool("v", false, "narrate each round")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	scenarios := strings.Split(*only, ",")
	for _, s := range scenarios {
		if !contains(chaos.Scenarios(), s) {
			fmt.Fprintf(stderr, "edgefence-chaos: unknown scenario %q (have %s)\n", s, strings.Join(chaos.Scenarios(), ", "))
			return 2
		}
	}
	for _, b := range []string{"edgefence", "edgefence-devsim", "edgefence-sandbox"} {
		if _, err := os.Stat(filepath.Join(*bin, b)); err != nil {
			fmt.Fprintf(stderr, "edgefence-chaos: %v (run `make build` or give --bin)\n", err)
			return 2
		}
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(stderr, "edgefence-chaos:", err)
		return 2
	}
	work, keep := *dir, *dir != ""
	if work == "" {
		if work, err = os.MkdirTemp("", "edgefence-chaos-"); err != nil {
			fmt.Fprintln(stderr, "edgefence-chaos:", err)
			return 2
		}
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var sum chaos.Summary
	fmt.Fprintf(stdout, "%-6s %-18s %-20s %8s %8s %6s %6s %6s %6s %5s  %s\n",
		"round", "scenario", "seed", "created", "accepted", "dup", "stale", "inval", "expir", "viol", "time")
	for i := range *rounds {
		if ctx.Err() != nil {
			break
		}
		sc := scenarios[int((*seed+uint64(i))%uint64(len(scenarios)))]
		rdir := filepath.Join(work, fmt.Sprintf("round-%04d-%s", i, sc))
		cfg := chaos.Config{Bin: abs, Dir: rdir, Seed: *seed + uint64(i), Devices: *devices, Load: *load, Logger: log}
		res, err := chaos.Run(ctx, cfg, sc)
		sum.Add(res, err)
		switch {
		case err != nil:
			fmt.Fprintf(stdout, "%-6d %-18s %-20d error: %v\n", i, sc, cfg.Seed, err)
			keep = true
		default:
			t := res.Report.Terminal
			fmt.Fprintf(stdout, "%-6d %-18s %-20d %8d %8d %6d %6d %6d %6d %5d  %v\n", i, sc, cfg.Seed, res.Report.Created,
				t["accepted"], t["duplicate"], t["stale"], t["invalid"], t["expired"], len(res.Report.Violations), res.Elapsed.Round(100*time.Millisecond))
			if !res.OK() {
				keep = true
				fmt.Fprint(stdout, res.Report.String())
			} else if !keep {
				os.RemoveAll(rdir)
			}
		}
	}
	fmt.Fprintln(stdout)
	sum.Print(stdout)
	if keep {
		fmt.Fprintf(stdout, "round files kept in %s\n", work)
	} else {
		os.RemoveAll(work)
	}
	if sum.Violations > 0 || sum.Failed > 0 {
		return 1
	}
	return 0
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
