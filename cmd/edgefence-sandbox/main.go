// Command edgefence-sandbox runs the embedded default world — a single-node
// etcd and an MQTT v5 broker on loopback, plus simulated devices — for
// `make demo` and for trying the agent by hand.
//
// Usage:
//
//	edgefence-sandbox serve [--dir DIR] [--fast] [--etcd-addr HOST:PORT]
//	                        [--mqtt-addr HOST:PORT] [--env FILE]
//	                        [--devices N] [--verdict-log FILE]
//	                        [--mqtt-users FILE] [--mqtt-acl FILE]
//	edgefence-sandbox demo [--bin DIR] [--contrast=false] [--keep]
//	edgefence-sandbox demo firmware [--bin DIR] [--keep]
//	edgefence-sandbox help [COMMAND]
//
// serve starts both servers and N simulated devices dev-1..dev-N (default
// 3) with their verdict log in DIR/verdicts.jsonl, writes an agent config
// for them to DIR/gw-1.yaml, prints the addresses in words and as one JSON
// line on stdout followed by the broker's users and passwords (it requires
// them and applies deploy/mosquitto's ACL; --mqtt-users and --mqtt-acl add
// more) and the commands to try, writes EDGEFENCE_ETCD=...
// and EDGEFENCE_MQTT=... to the --env file once ready, and runs until
// SIGINT or SIGTERM, or until its stdout is a pipe nobody reads any more
// (its reader exited: EPIPE). Either way it stops cleanly and removes its
// temp dir. demo replays Figure 1 of the fencing article on MQTT devices
// that check tokens, then on a PLC that cannot (a Modbus RTU slave on an
// RS-485 line behind gateway B's fence table), each scene followed by the
// same schedule without the fence unless --contrast=false. demo firmware
// runs a firmware job over two gateways: the holder frozen mid-download,
// the other resuming from the device's bytes, the frozen one's late chunk
// and late fw.activate refused stale. With no command
// it prints this list and exits 2. The logic lives in packages
// internal/sandbox and devices/sim.
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
	"sync"
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
		"serve": {"run etcd, an MQTT v5 broker and simulated devices on loopback until interrupted", serve},
		"demo":  {"replay the article's Figure 1 (frozen holder) on real etcd, MQTT and devices; `demo firmware`: a firmware update handed over mid-download", demo},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses, as edgefence's: 0 ok, 1 error, 2 usage.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// errStdoutClosed means stdout is a pipe whose reader went away.
var errStdoutClosed = errors.New("stdout closed (its reader exited)")

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 {
		// A server that starts by surprise is worse than a usage line.
		fmt.Fprintln(stderr, "edgefence-sandbox: a command is required")
		usage(stderr, cmds)
		return exitUsage
	}
	name, args := args[0], args[1:]
	switch name {
	case "help", "-h", "--help":
		if len(args) == 0 {
			usage(stdout, cmds)
			return exitOK
		}
		// help CMD is CMD -h, its text on stdout.
		name, args = args[0], []string{"-h"}
		stderr = stdout
	}
	cmd, ok := cmds[name]
	if !ok {
		if strings.HasPrefix(name, "-") {
			fmt.Fprintf(stderr, "edgefence-sandbox: flag %s before a command: the command comes first (edgefence-sandbox serve %s)\n", name, name)
		} else {
			fmt.Fprintf(stderr, "edgefence-sandbox: unknown command %q\n", name)
		}
		usage(stderr, cmds)
		return exitUsage
	}

	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore the default action: a second ^C
	// kills a shutdown that hangs.
	context.AfterFunc(sigCtx, stop)
	// A write to a stdout whose reader went away (serve | head -1) raises
	// SIGPIPE, which kills a Go program before its deferred cleanup — the
	// temp dir, the etcd data, the env file stay behind. With SIGPIPE
	// notified the write fails with EPIPE instead, and a failed write to
	// stdout stops the command like an interrupt. SIGPIPEs of other
	// writes (a client's closed socket) are not ours to act on: the
	// channel is never read.
	sigpipe := make(chan os.Signal, 1)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	defer signal.Stop(sigpipe)
	ctx, cancel := context.WithCancelCause(sigCtx)
	defer cancel(nil)
	out := &stopOnError{w: stdout, stop: func(err error) { cancel(fmt.Errorf("%w: %w", errStdoutClosed, err)) }}

	err := cmd.run(ctx, args, out, stderr)
	if cause := context.Cause(ctx); errors.Is(cause, errStdoutClosed) {
		err = cause // not the context.Canceled it caused
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	default:
		fmt.Fprintf(stderr, "edgefence-sandbox %s: %v\n", name, err)
		return exitFailure
	}
}

// stopOnError is stdout that calls stop on the first failed write.
type stopOnError struct {
	w    io.Writer
	once sync.Once
	stop func(error)
}

func (s *stopOnError) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		s.once.Do(func() { s.stop(err) })
	}
	return n, err
}

// newFlagSet returns the flag set of command name, whose -h prints the
// command's usage line, its summary, and its flags.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: edgefence-sandbox %s %s\n\n%s.\n\nflags:\n", name, synopsis, commands()[name].summary)
		fs.PrintDefaults()
	}
	return fs
}

func usage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: edgefence-sandbox <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "  help     this text; help COMMAND: that command's flags")
	fmt.Fprintln(w, "\nexit status: 0 ok; 1 error; 2 usage. Run 'edgefence-sandbox COMMAND -h' for a command's flags.")
}
