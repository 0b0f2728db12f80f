// Command edgefence is the gateway agent and its operator CLI:
//
//	edgefence run [--config FILE]          run the agent (systemd Type=notify)
//	edgefence status [--json]              the running agent: session, links, devices, counters
//	edgefence devices [--json]             the running agent's devices: state, token, fence, outbox, verdicts
//	edgefence send DEVICE KIND [JSON]      issue one command via the running agent; prints the verdict (--json)
//	edgefence fence list|show [--json]     the gateway's fence table
//	edgefence outbox list|show [--json]    the agent's outbox: queued commands and terminal states
//	edgefence twin get|set|watch [--json]  a device's twin in etcd
//	edgefence job create|list|show|pause|resume|cancel  firmware jobs and their rollouts in etcd
//	edgefence etcd bump-revision --to N    raise etcd's revision past the tokens in use (any etcd version)
//	edgefence keys new|certify|revoke|verify  keys of signed commands: operator root, gateway certificates, revocations
//	edgefence config check [--json] FILE   validate a config file; print it with defaults filled in
//	edgefence version [--json]
//	edgefence help [COMMAND]
//
// Exit status, for scripts: 0 ok (send: accepted or duplicate — the device
// applied the command, once); 1 error; 2 usage; 3 send: the device refused
// the command (stale, invalid); 4 send: queued, no verdict yet; 5 twin set:
// version conflict; 6 the agent is not running or not reachable on its socket;
// 7 send: fate unknown (a gateway-fenced device never answered a command
// that may not be repeated).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/agent"
)

// version and commit are set at build time with -ldflags
// "-X main.version=... -X main.commit=..." (make build, make cross). Without
// a commit, the VCS revision go build stamps into the binary is used.
var (
	version = "dev"
	commit  = ""
)

// buildInfo is what `edgefence version` prints.
type buildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func readBuildInfo() buildInfo {
	c := commit
	if c == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					c = s.Value[:12]
				}
			}
		}
	}
	if c == "" {
		c = "unknown"
	}
	return buildInfo{Version: version, Commit: c, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
}

// versionLine is what `edgefence version` prints.
func versionLine() string {
	b := readBuildInfo()
	return fmt.Sprintf("edgefence %s (commit %s, %s %s/%s)", b.Version, b.Commit, b.Go, b.OS, b.Arch)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: edgefence <command> [flags]

commands:
  run [--config FILE]             run the agent
  status [--json]                 the running agent: session, links, devices, counters
  devices [--json]                the running agent's devices: state, token, fence, policy,
                                  outbox backlog, verdict counts
  send DEVICE KIND [JSON]         issue one command via the running agent; print the verdict
  fence list | show DEVICE        the fence table's marks (from its file or the agent)
  outbox list | show ID           the outbox's queued commands and terminal states
  twin get | set | watch          a device's twin in etcd: read, merge into desired, follow
  job create | list | show | pause | resume | cancel
                                  firmware jobs in etcd: create one, follow its rollout and
                                  every device's execution (show --watch), pause, cancel
  etcd bump-revision --to N       raise etcd's revision to N, so that every new token is above
                                  it: token regression recovery on any etcd version
  keys new | certify | revoke | verify
                                  keys of signed commands: the operator's root, gateway
                                  certificates, revocation lists (offline, files only)
  config check [--json] FILE      validate a config file; print it with defaults filled in
  version [--json]                version, commit, Go version, OS and architecture
  help [COMMAND]                  this text, or a command's

Read commands take --json. Commands that talk to the running agent find its
socket with --socket PATH, or --config FILE (its api.socket), or
$EDGEFENCE_SOCKET, or ` + agent.DefaultSocket + `.

exit status:
  0  ok (send: the device applied the command: accepted, or duplicate —
     it had already applied this very command and did not apply it again)
  1  error (the message says which)
  2  usage: unknown command or flag, wrong arguments
  3  send: the device refused the command (stale, invalid)
  4  send: queued in the agent's outbox, no verdict yet
  5  twin set --if-version: conflict, desired moved on
  6  the agent is not running or not reachable on its socket
  7  send: fate unknown: the command reached a gateway-fenced device that
     never answered, and it may not be repeated; check the device

Run 'edgefence help COMMAND' or 'edgefence COMMAND -h' for a command's flags.
`

// Exit statuses (see usage).
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitVerdict     = 3 // send: the device refused the command (stale, invalid)
	exitQueued      = 4 // send: stored in the outbox, no verdict yet
	exitUnreachable = 6 // no agent answers on the socket
	exitUnknown     = 7 // send: fate unknown (fence.Unknown)
)

// commands are the top-level commands; hidden ones are not in usage.
var commands = map[string]command{
	"run":     func(args []string, _, stderr io.Writer) error { return cmdRun(args, stderr) },
	"status":  func(args []string, stdout, stderr io.Writer) error { return cmdStatus(args, stdout, stderr) },
	"devices": cmdDevices,
	"send":    cmdSend,
	"fence":   cmdFence,
	"outbox":  cmdOutbox,
	"twin":    cmdTwin,
	"job":     cmdJob,
	"etcd":    cmdEtcd,
	"keys":    cmdKeys,
	"config":  cmdConfig,
	"version": cmdVersion,
	// Hidden aliases.
	"check-config": cmdConfigCheck,
	"--version":    cmdVersion,
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "--help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		// help CMD [SUB] is CMD [SUB] -h, its text on stdout.
		name, rest = rest[0], append(rest[1:], "-h")
		stderr = stdout
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "edgefence: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}
	return report(c(rest, stdout, stderr), stderr)
}

// report prints err for people and returns the exit status.
func report(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if ex, ok := errors.AsType[exitError](err); ok {
		return ex.code
	}
	if errors.Is(err, agent.ErrUnreachable) {
		fmt.Fprintln(stderr, "edgefence:", unreachable(err))
		return exitUnreachable
	}
	if ces := agent.ConfigErrors(err); len(ces) > 0 {
		// One problem a line, file:line: key: message, as compilers do.
		for _, ce := range ces {
			fmt.Fprintln(stderr, ce)
		}
		n := "1 problem"
		if len(ces) > 1 {
			n = fmt.Sprintf("%d problems", len(ces))
		}
		fmt.Fprintf(stderr, "edgefence: invalid config: %s\n", n)
		return exitFailure
	}
	fmt.Fprintln(stderr, "edgefence:", err)
	return exitFailure
}

// unreachable explains why no agent answers on its socket.
func unreachable(err error) string {
	sock := "the socket"
	if e, ok := errors.AsType[*net.OpError](err); ok && e.Addr != nil {
		sock = e.Addr.String()
	}
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Sprintf("no agent at %s (is edgefence running? systemctl status edgefence; or pass --socket/--config)", sock)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("no agent listens on %s: a stale socket, left by an agent that exited (systemctl status edgefence; journalctl -u edgefence)", sock)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return fmt.Sprintf("permission denied on %s: the socket is for the agent's user and group (run with sudo, or as a member of its group)", sock)
	}
	return err.Error()
}

// exitError carries an exit code for a failure already reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// socketFlag registers the flags that locate a running agent's socket.
func socketFlags(fs *flag.FlagSet) func() (string, error) {
	socket := fs.String("socket", "", "agent API socket (default: from --config, $EDGEFENCE_SOCKET, or "+agent.DefaultSocket+")")
	config := fs.String("config", "", "agent config file, to find its socket")
	return func() (string, error) {
		switch {
		case *socket != "":
			return *socket, nil
		case *config != "":
			c, err := agent.LoadConfig(*config)
			if err != nil {
				return "", err
			}
			return c.API.Socket, nil
		case os.Getenv("EDGEFENCE_SOCKET") != "":
			return os.Getenv("EDGEFENCE_SOCKET"), nil
		}
		return agent.DefaultSocket, nil
	}
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := socketFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edgefence status [flags]\n\nThe running agent: gateway, etcd session, MQTT link, devices, counters.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	st, err := agentStatus(sock)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, st)
	}
	printStatus(stdout, st)
	return nil
}

// parseFlags parses args into fs and wants nargs arguments after the
// flags (-1: any): else it prints usage and is a usage error.
func parseFlags(fs *flag.FlagSet, args []string, nargs int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return exitError{exitUsage}
	}
	if nargs >= 0 && fs.NArg() != nargs {
		fs.Usage()
		return exitError{exitUsage}
	}
	return nil
}

// agentStatus asks the running agent for its status.
func agentStatus(sock func() (string, error)) (*agent.Status, error) {
	path, err := sock()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return agent.NewAPIClient(path).Status(ctx)
}

// printJSON prints v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON: version, commit, go, os, arch")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edgefence version [--json]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, readBuildInfo())
	}
	_, err := fmt.Fprintln(stdout, versionLine())
	return err
}

func printStatus(w io.Writer, st *agent.Status) {
	sess := "none"
	if st.Etcd.Session {
		sess = "lease " + st.Etcd.Lease + " (ttl " + st.Etcd.TTL + ")"
	}
	fmt.Fprintf(w, "gateway  %s\netcd     %s  session: %s, %d opened\n", st.Gateway, strings.Join(st.Etcd.Endpoints, ","), sess, st.Etcd.Sessions)
	if st.Transport != nil {
		fmt.Fprintf(w, "mqtt     %s\n", mqttLine(st.Transport))
	}
	fmt.Fprintf(w, "auth     %s\n", authLine(st.Devices))
	if st.Trust != nil {
		fmt.Fprintf(w, "trust    %s\n", trustLine(st.Trust))
	}
	printTail(w, st.LeaseTail)
	fmt.Fprintf(w, "\n%-20s %-12s %10s %8s  %s\n", "DEVICE", "STATE", "TOKEN", "SEQ", "LAST VERDICT")
	for _, d := range st.Devices {
		tok := "-"
		if d.Token != 0 {
			tok = fmt.Sprint(d.Token)
		}
		fmt.Fprintf(w, "%-20s %-12s %10s %8d  %s\n", d.ID, d.State, tok, d.Seq, lastVerdict(d.LastAck, true))
		if d.Reason != "" {
			fmt.Fprintf(w, "%-20s %s: %s\n", "", d.State, oneLine(d.Reason))
		}
		if d.Holder != nil {
			fmt.Fprintf(w, "%-20s %s\n", "", holderText(d.Holder, time.Now()))
		}
	}
	c := st.Counters
	fmt.Fprintf(w, "\nsent %d: accepted %d, duplicate %d, stale %d, invalid %d, no ack %d, send errors %d\n",
		c.Sent, c.Accepted, c.Duplicate, c.Stale, c.Invalid, c.NoAck, c.SendErrors)
	fmt.Fprintf(w, "ended unsent: expired %d, superseded %d\n", c.Expired, c.Superseded)
	fmt.Fprintf(w, "leases: acquired %d, lost %d, token_regressions %d, released after a refusal %d, sessions reattached %d\n",
		c.Acquired, c.Lost, c.Regressions, c.Released, c.Reattached)
	if t := st.Twins; t != nil {
		watch := "watching desired"
		if !t.Watching {
			watch = "not watching"
		}
		fmt.Fprintf(w, "twins %s: %d desired changes, %d twin.set sent (%d refused), reported %d written, %d fenced, %d queued, %d device reports (%d malformed), %d errors\n",
			watch, t.Events, t.Sent, t.Refused, t.Written, t.Fenced, t.Queued, t.Reports, c.StateMalformed, t.Errors)
	}
}

func newLogger(c agent.LogConfig, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	format := c.Format
	if format == "auto" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}
