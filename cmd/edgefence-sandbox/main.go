// Command edgefence-sandbox runs the embedded default world — a single-node
// etcd and an MQTT v5 broker on loopback, plus simulated devices — for
// `make demo` and for trying the agent by hand.
//
// Usage:
//
//	edgefence-sandbox [serve] [--dir DIR] [--fast] [--etcd-addr HOST:PORT]
//	                  [--mqtt-addr HOST:PORT] [--env FILE]
//	                  [--devices N] [--verdict-log FILE]
//
// serve (the default) starts both servers and N simulated devices dev-1..dev-N
// (default 3) with their verdict log in DIR/verdicts.jsonl, writes an agent
// config for them to DIR/gw-1.yaml, prints the addresses in words and as one
// JSON line on stdout followed by the commands to try, writes
// EDGEFENCE_ETCD=... and EDGEFENCE_MQTT=... to the --env file once ready, and
// runs until SIGINT or SIGTERM. The logic lives in packages devices/sandbox
// and devices/sim.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand: it parses its own flags from args and runs
// until ctx is done. A usage error is returned as errUsage.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var errUsage = errors.New("usage")

func commands() map[string]command {
	return map[string]command{
		"serve": {"run etcd, an MQTT v5 broker and simulated devices on loopback until interrupted (default)", serve},
		"demo":  {"replay the article's Figure 1 (frozen holder) on real etcd, MQTT and devices", demo},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		usage(stdout, cmds)
		return 0
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "edgefence-sandbox: unknown command %q\n", name)
		usage(stderr, cmds)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default action: a second ^C
	// kills a shutdown that hangs.
	context.AfterFunc(ctx, stop)
	err := cmd.run(ctx, args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "edgefence-sandbox %s: %v\n", name, err)
		return 1
	}
}

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: edgefence-sandbox [command] [flags]   (command -h for its flags)")
	fmt.Fprintln(w, "commands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].summary)
	}
}
