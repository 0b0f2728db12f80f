package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/daemon"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

const fenceResetUsage = `usage: edgefence fence reset DEVICE --to TOKEN [--seq N] --root-key FILE --root-kid KID [--counter N] [--epoch N] [--yes] (--out FILE | --config FILE)
       edgefence fence reset --from FILE --config FILE [--yes]

Set DEVICE's fence mark to TOKEN/N by the operator's authority: a reset
statement signed with the operator's root key (offline: nothing here needs
a network to sign), which the device's fence point (its shim, or for a
` + "`fence: gateway`" + ` device its home gateway's fence table) checks against the
root it was provisioned with, applies durably and answers by the reset id.
It is the way back for a device a forged command bricked (its mark far
above every real token) and after a token regression (etcd rebuilt or
wiped), on any etcd version.

Afterwards the device accepts tokens above TOKEN (with the default --seq,
every seq of TOKEN itself counts as done). After a token regression choose
etcd's current revision (` + "`etcdctl endpoint status -w json`" + `, header.revision):
the next lock a gateway takes has a token above it.

Each reset carries a counter the fence point keeps; one not above the last
reset's is refused (a replay). It defaults to the current Unix time in
milliseconds, so a later reset has a higher one.

Each reset also opens an epoch: the device refuses every command of an
earlier one, whatever its token, so no command signed before the reset is
admitted after it; a reset whose epoch is not above the device's is
refused. --epoch defaults to the current Unix time in milliseconds, or
(with --config) one above the highest epoch etcd holds, the fleet's
(edgefence keys epoch) and the device's last reset's, if that is higher.

--out writes the signed reset to a file (an air-gapped operator key: sign
there, deliver with --from on a machine that reaches the broker).
--config publishes it on the device's command topic with that agent config's
MQTT settings (broker, credentials, TLS, prefix) and waits for the ack: for
a device with auth: required, one signed by its enrolled key (its
certificate at <etcd prefix>/trust/devices/DEVICE; for a fence: gateway
device its home gateway's, <etcd prefix>/trust/certs/), verified against
the config's auth.trust_root; once applied, it also puts the signed reset
at <etcd prefix>/trust/resets/DEVICE,
where a gateway not running now (one that held the device before a token
regression, whose own guard remembers a higher token) finds it and, with
auth.trust_root set, takes the device again above the reset.

flags:
`

// resetFlags are the flags of `edgefence fence reset`.
type resetFlags struct {
	fs                     *flag.FlagSet
	to, seq, counter       string
	epoch                  string
	rootKey, rootKid, out  string
	from, config           string
	yes                    bool
	timeout                time.Duration
	stdin                  io.Reader
	stdout, stderr         io.Writer
	now                    func() time.Time
	tokenV, seqV, counterV uint64 // parsed
	epochV                 uint64 // parsed; 0: the default (defaultEpoch)
	counterDefault         bool
	device                 string
	deliverCfg             *agent.Config    // --config, loaded
	trust                  *auth.Trust      // its auth.trust_root, own certificate and list; nil without a root
	cli                    *clientv3.Client // its etcd, once dialed (fenceresetack.go)
	signedFromFile         bool
}

func cmdFenceReset(args []string, stdout, stderr io.Writer) error {
	f := &resetFlags{fs: flag.NewFlagSet("fence reset", flag.ContinueOnError), stdin: os.Stdin, stdout: stdout, stderr: stderr, now: time.Now}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.to, "to", "", "the new mark's `TOKEN` (at least 1): afterwards the device accepts tokens above it")
	fs.StringVar(&f.seq, "seq", "", "the new mark's seq `N` (default 2^64-1: every seq of TOKEN counts as done)")
	fs.StringVar(&f.rootKey, "root-key", "", "the operator's root private key (PEM, edgefence keys new)")
	fs.StringVar(&f.rootKid, "root-kid", "", "the root key's id, as the fence points were provisioned with it")
	fs.StringVar(&f.counter, "counter", "", "the reset counter `N` (default: the current Unix time in milliseconds)")
	fs.StringVar(&f.epoch, "epoch", "", "the epoch `N` the reset opens (default: the current Unix time in milliseconds, or above the highest in etcd)")
	fs.BoolVar(&f.yes, "yes", false, "do not ask for confirmation")
	fs.StringVar(&f.out, "out", "", "write the signed reset to `FILE` (new file) instead of delivering it")
	fs.StringVar(&f.from, "from", "", "deliver the pre-signed reset in `FILE` (made with --out)")
	fs.StringVar(&f.config, "config", "", "agent config `FILE`: deliver over MQTT with its settings and wait for the ack")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for the broker and the ack")
	fs.Usage = func() {
		fmt.Fprint(stderr, fenceResetUsage)
		fs.PrintDefaults()
	}
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := f.check(rest); err != nil {
		fmt.Fprintf(stderr, "edgefence fence reset: %v\n", err)
		return exitError{exitUsage}
	}
	return f.run()
}

// parseInterspersed parses flags placed before, between and after the
// arguments, and returns the arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	ff := &fenceFlags{fs: fs}
	return ff.parse(args)
}

// check validates the flags and fills in the parsed values.
func (f *resetFlags) check(rest []string) error {
	switch {
	case f.out != "" && f.config != "":
		return errors.New("--out or --config, not both")
	case f.out == "" && f.config == "":
		return errors.New("want --out FILE (write the signed reset) or --config FILE (deliver it)")
	case f.from != "":
		if len(rest) != 0 || f.to != "" || f.seq != "" || f.counter != "" || f.epoch != "" || f.rootKey != "" || f.rootKid != "" || f.out != "" {
			return errors.New("--from delivers a signed reset as it is: no DEVICE, --to, --seq, --counter, --epoch, --root-key, --root-kid or --out")
		}
		return nil
	case len(rest) != 1:
		return errors.New("want exactly one DEVICE")
	case f.to == "" || f.rootKey == "" || f.rootKid == "":
		return errors.New("want --to TOKEN, --root-key FILE and --root-kid KID")
	}
	f.device = rest[0]
	if err := fence.ValidateDeviceID(f.device); err != nil {
		return err
	}
	var err error
	if f.tokenV, err = positive("--to", f.to); err != nil {
		return err
	}
	f.seqV = math.MaxUint64
	if f.seq != "" {
		if f.seqV, err = positive("--seq", f.seq); err != nil {
			return err
		}
	}
	if f.counter == "" {
		f.counterV, f.counterDefault = uint64(f.now().UnixMilli()), true
	} else if f.counterV, err = positive("--counter", f.counter); err != nil {
		return err
	}
	if f.epoch != "" {
		if f.epochV, err = positive("--epoch", f.epoch); err != nil {
			return err
		}
	}
	return nil
}

func positive(name, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s %q: want an integer from 1 to 2^64-1", name, s)
	}
	return n, nil
}

// run signs (or reads) the reset, shows it, asks, and writes or delivers it.
func (f *resetFlags) run() error {
	if f.config != "" {
		var err error
		if f.deliverCfg, err = agent.LoadConfig(f.config); err != nil {
			return err
		}
		if f.trust, err = f.deliverCfg.Auth.OperatorTrust(nil); err != nil {
			return err
		}
	}
	defer func() {
		if f.cli != nil {
			f.cli.Close()
		}
	}()
	raw, r, err := f.statement()
	if err != nil {
		return err
	}
	f.describe(r)
	if !f.yes && !f.confirm() {
		fmt.Fprintln(f.stderr, "edgefence fence reset: not confirmed; nothing written or sent")
		return exitError{exitFailure}
	}
	if f.out != "" {
		if err := writeNewFile(f.out, raw); err != nil {
			return err
		}
		fmt.Fprintf(f.stdout, "wrote %s (%d bytes); deliver it with: edgefence fence reset --from %s --config FILE\n", f.out, len(raw), f.out)
		return nil
	}
	return f.deliver(raw, r)
}

// statement returns the signed reset: made here, or read from --from.
func (f *resetFlags) statement() ([]byte, *auth.Reset, error) {
	if f.from != "" {
		raw, err := os.ReadFile(f.from)
		if err != nil {
			return nil, nil, err
		}
		r, err := auth.PeekReset(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: not a reset statement: %w", f.from, err)
		}
		if err := r.Validate(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", f.from, err)
		}
		f.device, f.signedFromFile = r.Device, true
		return raw, r, nil
	}
	key, err := auth.ReadKey(f.rootKey)
	if err != nil {
		return nil, nil, err
	}
	root, err := auth.NewRoot([]byte(f.rootKid), key)
	if err != nil {
		return nil, nil, err
	}
	epoch := f.epochV
	if epoch == 0 {
		if epoch, err = f.defaultEpoch(); err != nil {
			return nil, nil, err
		}
	}
	r := auth.Reset{Device: f.device, Token: fence.Token(f.tokenV), Seq: f.seqV, Counter: f.counterV,
		ID: auth.NewResetID(), Issued: f.now().UnixMilli(), Epoch: epoch}
	raw, err := root.Reset(r)
	if err != nil {
		return nil, nil, err
	}
	return raw, &r, nil
}

// describe prints what the reset will do.
func (f *resetFlags) describe(r *auth.Reset) {
	w := f.stdout
	fmt.Fprintf(w, "fence reset %s of device %s\n", r.ID, r.Device)
	accepts := fmt.Sprintf("tokens above %d", r.Token)
	if r.Seq != math.MaxUint64 {
		accepts = fmt.Sprintf("token %d from seq %d, and tokens above it", r.Token, r.Seq+1)
	}
	fmt.Fprintf(w, "  new mark: %d/%d — afterwards the device accepts %s, refuses every other\n", r.Token, r.Seq, accepts)
	how := ""
	if f.counterDefault {
		how = " (default: the current Unix time in milliseconds)"
	}
	fmt.Fprintf(w, "  counter:  %d%s; the fence point refuses a reset whose counter is not above its last\n", r.Counter, how)
	fmt.Fprintf(w, "  epoch:    %d; the device refuses every command of an earlier epoch, and a reset not above its epoch\n", r.Epoch)
	if f.signedFromFile {
		fmt.Fprintf(w, "  signed:   read from %s (the fence point checks the signature)\n", f.from)
	} else {
		fmt.Fprintf(w, "  signed:   by the operator root %q (%s)\n", f.rootKid, f.rootKey)
	}
	if f.out != "" {
		fmt.Fprintf(w, "  action:   write it to %s\n", f.out)
		return
	}
	topics := mqtt.Topics{Prefix: f.deliverCfg.MQTT.Prefix}
	fmt.Fprintf(w, "  action:   publish it on %s via %s and wait for the ack\n", topics.Cmd(r.Device), strings.Join(f.deliverCfg.MQTT.Brokers, ","))
}

// confirm asks on stdin; only "y" or "yes" confirms.
func (f *resetFlags) confirm() bool {
	fmt.Fprint(f.stdout, "Proceed? [y/N] ")
	line, _ := bufio.NewReader(f.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	fmt.Fprintln(f.stdout)
	return false
}

// deliver publishes the reset and prints the fence point's answer: exit 0
// if it was applied, 1 if it was refused or no answer came.
func (f *resetFlags) deliver(raw []byte, r *auth.Reset) error {
	c := f.deliverCfg
	mc, err := daemon.MQTTClientConfig(c.MQTT, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	mc.ClientID = fmt.Sprintf("%s-fence-reset-%d", c.MQTT.ClientID, os.Getpid())
	check, err := f.ackCheck(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	ack, err := mqtt.RequestChecked(ctx, mc, mqtt.Topics{Prefix: c.MQTT.Prefix}, r.Device, raw, r.ID, check)
	if err != nil {
		return fmt.Errorf("%w (the reset's fate is unknown; sending the same file again is safe: a replay is refused)", err)
	}
	if ack.Verdict == fence.Accepted {
		fmt.Fprintf(f.stdout, "accepted: %s's fence mark is now %s in epoch %d (reset %s)\n", r.Device, ack.Mark(), ack.Epoch, ack.ID)
		f.publish(raw, r)
		return nil
	}
	fmt.Fprintf(f.stdout, "refused (%s): %s; %s's mark stays %s in epoch %d\n", ack.Verdict, ack.Reason, r.Device, ack.Mark(), ack.Epoch)
	return exitError{exitFailure}
}

// publish puts the applied reset, root-signed and so public, at
// <etcd prefix>/trust/resets/<device> in the config's etcd: agents that
// were not running when it was applied (a gateway that held the device
// before a token regression) find it there and lower their own guard
// (agent.leases.lowerGuard). Failing to is said, not fatal: the device has
// the reset; run the command again when etcd is back (a replay is refused
// by the device and published again).
func (f *resetFlags) publish(raw []byte, r *auth.Reset) {
	key := agent.TrustResetKey(f.deliverCfg.Etcd.Prefix, r.Device)
	err := func() error {
		cli, err := f.etcd()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		defer cancel()
		_, err = cli.Put(ctx, key, string(raw))
		return err
	}()
	if err != nil {
		fmt.Fprintf(f.stdout, "not published at %s (%v): gateways that were not running keep their own guard until it is\n", key, err)
		return
	}
	fmt.Fprintf(f.stdout, "published at %s for the gateways not running now\n", key)
}

// writeNewFile writes b to path, which must not exist, fsynced.
func writeNewFile(path string, b []byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = fh.Write(b)
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
