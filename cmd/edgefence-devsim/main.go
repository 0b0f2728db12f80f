// Command edgefence-devsim runs simulated devices behind fence points on an
// MQTT v5 broker: each device takes fenced commands on <prefix>/dev/<id>/cmd,
// acks them on <prefix>/dev/<id>/ack and publishes its state on
// <prefix>/dev/<id>/state. Marks and states live in a bbolt file in --dir,
// so a re-run on the same directory resumes them.
//
// Usage:
//
//	edgefence-devsim --mqtt mqtt://127.0.0.1:1883 --devices dev-1,dev-2 --dir /var/lib/devsim
//	edgefence-devsim --mqtt mqtt://127.0.0.1:1883 --count 100 --id-prefix dev- --dir ./data --log verdicts.jsonl
//	edgefence-devsim --firmware --mqtt mqtt://127.0.0.1:1883 --devices fw-1,fw-2 --dir ./fw --fw-window 30s
//	edgefence-devsim --firmware --in-process --mqtt mqtt://127.0.0.1:1883 --count 1000 --dir ./fw --history fw.jsonl
//
// With --firmware the devices take firmware jobs (fw.* kinds, package
// fwjob) besides the thermostat's commands: one child process per device
// (--firmware-device ID, the same flags), its state in <dir>/<id>, its log
// in <dir>/<id>/devsim.log and its pid in <dir>/<id>/pid. A device that
// must reboot exits with code 3 and is started again at once; one that
// dies otherwise (kill -9: power loss) after --restart-delay. The image in
// the booted slot decides a trial boot's health check (EDGEFENCE-HEALTH=
// fail, hang or crash; see sim.FirmwareImage). Their state reports are
// retained. With --in-process every firmware device runs in this one
// process instead (sim.FirmwareFleet), a reboot closing and booting it in
// place: for scale benchmarks; the proofs use a process per device.
// Firmware devices take --history too, each device under the source
// <history-source>:<id>.
//
// Logs go to stderr (slog text); one line with msg=ready is logged once the
// broker has acknowledged every subscription. The verdict log (one JSON line
// per decision, see sim.VerdictRecord) goes to --log, appended, or stdout.
// With --history FILE every decision is also appended to FILE as a
// fence/history event (source --history-source), for history.Check.
// A broker that requires credentials (deploy/mosquitto) gets --mqtt-user
// and the password from $EDGEFENCE_MQTT_PASSWORD or --mqtt-password-file:
// with Mosquitto's ACL a single device logs in as its device id.
// SIGINT or SIGTERM shuts down cleanly.
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
	"strings"
	"syscall"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/transport/mqtt"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit code: 0 after a clean
// shutdown, 1 on a runtime error, 2 on a usage error, 3 (exitReboot) when
// a firmware device reboots.
// devsimFlags are the command line of edgefence-devsim.
type devsimFlags struct {
	broker, prefix, devices, idPrefix, dir, logPath, clientID *string
	port, histPath, histSrc                                   *string
	mqttUser, mqttPassFile                                    *string
	trustRoot, trustRootKid, certs, revocations, deviceKeys   *string
	epoch                                                     *string
	resetRoot                                                 *string
	count, regs, lanes                                        *int
	noFence                                                   *bool
	modbus                                                    modbusFlags
	fw                                                        firmwareFlags
}

func newDevsimFlags(fs *flag.FlagSet) devsimFlags {
	return devsimFlags{
		broker:       fs.String("mqtt", "", "MQTT broker URL, e.g. mqtt://127.0.0.1:1883 (required)"),
		prefix:       fs.String("prefix", mqtt.DefaultPrefix, "MQTT topic prefix"),
		devices:      fs.String("devices", "", "comma-separated device ids (or use --count)"),
		count:        fs.Int("count", 0, "number of devices <id-prefix>1..<id-prefix>N (instead of --devices)"),
		idPrefix:     fs.String("id-prefix", "dev-", "device id prefix for --count"),
		lanes:        fs.Int("lanes", 1, "MQTT clients the devices are spread over: commands arriving on different lanes together are decided together and their marks committed with one fsync, each acked after it (as devices with flash of their own answer in parallel)"),
		dir:          fs.String("dir", "", "data directory for the marks and states (required)"),
		logPath:      fs.String("log", "", "verdict log file, JSON lines, appended (default stdout)"),
		clientID:     fs.String("client-id", "", "MQTT client id (default derived from the host name and --dir)"),
		noFence:      unsafeFlags(fs),
		port:         fs.String("serial", "", "run ONE legacy register device (no fence of its own) on this serial port instead of MQTT devices"),
		regs:         fs.Int("registers", 0, "with --serial: number of holding registers (default 256)"),
		histPath:     fs.String("history", "", "append every fence decision to this file as history events (JSON lines, fence/history)"),
		histSrc:      fs.String("history-source", "devsim", "source name of the --history events"),
		mqttUser:     fs.String("mqtt-user", "", "MQTT user name; the password comes from $"+envMQTTPassword+" or --mqtt-password-file"),
		mqttPassFile: fs.String("mqtt-password-file", "", "file holding the MQTT password (one line)"),
		trustRoot:    fs.String("trust-root", "", "the operator's public key (PEM): accept only commands signed by a key it certified for the device (--certs, or learned from a gateway's trust update and kept in --dir)"),
		trustRootKid: fs.String("trust-root-kid", "operator", "the operator key's id"),
		certs:        fs.String("certs", "", "with --trust-root: comma-separated gateway certificates (edgefence keys certify)"),
		revocations:  fs.String("revocations", "", "with --trust-root: a revocation list (edgefence keys revoke)"),
		epoch:        fs.String("epoch", "", "with --trust-root: the fleet's epoch statement (edgefence keys epoch); a newer one learned over the air and kept in --dir wins"),
		resetRoot:    fs.String("reset-root", "", "the operator's public key (PEM): accept its fence resets (edgefence fence reset) while commands stay unsigned; --trust-root does both"),
		deviceKeys:   fs.String("device-keys", "", "directory of the devices' keys (<id>.key, <id>.cert: edgefence keys enrol): sign acks and state reports"),
		modbus: modbusFlags{
			tcp:   fs.String("modbus-tcp", "", "serve simulated Modbus devices (no fence of their own) as a Modbus TCP server on this address, e.g. 127.0.0.1:5020"),
			rtu:   fs.String("modbus-rtu", "", "serve simulated Modbus devices as a Modbus RTU slave on this tty (a pty end)"),
			units: fs.String("modbus-units", "1", "with --modbus-tcp or --modbus-rtu: the unit ids served, comma-separated (1..247)"),
			baud:  fs.Int("modbus-baud", 19200, "with --modbus-rtu: the line's baud rate (its t3.5 silences)"),
		},
		fw: newFirmwareFlags(fs),
	}
}

// trust returns the fence points' Keys from --trust-root, --certs,
// --revocations and --epoch; nil without --trust-root (plain envelopes).
func (f devsimFlags) trust() (auth.Keys, error) {
	if *f.trustRoot == "" {
		return nil, nil
	}
	pub, err := auth.ReadPublic(*f.trustRoot)
	if err != nil {
		return nil, err
	}
	t, err := auth.NewTrust([]byte(*f.trustRootKid), pub, nil)
	if err != nil {
		return nil, err
	}
	for _, path := range strings.Split(*f.certs, ",") {
		if path == "" {
			continue
		}
		if _, err := t.AddCertificateFile(path); err != nil {
			return nil, err
		}
	}
	if *f.revocations != "" {
		if err := t.ApplyRevocationsFile(*f.revocations); err != nil {
			return nil, err
		}
	}
	if *f.epoch != "" {
		if err := t.ApplyEpochFile(*f.epoch); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// deviceAuth is what --trust-root, --certs, --revocations, --reset-root and
// --device-keys make of the devices ids.
type deviceAuth struct {
	keys    auth.Keys
	root    auth.ResetVerifier
	signers map[string]*auth.Signer
}

func (f devsimFlags) deviceAuth(ids []string) (deviceAuth, error) {
	var a deviceAuth
	var err error
	if a.keys, err = f.trust(); err != nil {
		return a, fmt.Errorf("trust: %w", err)
	}
	if a.root, err = f.resetRootKey(); err != nil {
		return a, fmt.Errorf("reset root: %w", err)
	}
	if a.signers, err = deviceSigners(*f.deviceKeys, ids); err != nil {
		return a, fmt.Errorf("device keys: %w", err)
	}
	return a, nil
}

// resetRootKey returns the fleet's Root from --reset-root (nil without it:
// the --trust-root chain, if any, checks resets).
func (f devsimFlags) resetRootKey() (auth.ResetVerifier, error) {
	if *f.resetRoot == "" {
		return nil, nil
	}
	pub, err := auth.ReadPublic(*f.resetRoot)
	if err != nil {
		return nil, err
	}
	return auth.NewRootKey([]byte(*f.trustRootKid), pub)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edgefence-devsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newDevsimFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "edgefence-devsim: %s\n", msg)
		fs.Usage()
		return 2
	}
	if *f.modbus.tcp != "" || *f.modbus.rtu != "" {
		if *f.modbus.tcp != "" && *f.modbus.rtu != "" || *f.port != "" || *f.broker != "" || *f.count != 0 || *f.noFence || *f.dir != "" ||
			*f.histPath != "" || *f.mqttUser != "" || *f.mqttPassFile != "" || *f.devices != "" || fs.NArg() > 0 {
			return usage("--modbus-tcp or --modbus-rtu (one) runs simulated Modbus devices: it takes --modbus-units, --modbus-baud, --registers, --log; not --mqtt, --serial, --devices, --count, --dir, --history or an unsafe flag")
		}
		return runModbus(ctx, log, f.modbus, *f.regs, *f.logPath, stdout)
	}
	if *f.port != "" {
		if *f.broker != "" || *f.count != 0 || *f.noFence || *f.dir != "" || *f.histPath != "" || *f.mqttUser != "" || *f.mqttPassFile != "" {
			return usage("--serial runs a legacy device: it takes --devices ID (one), --registers, --log; not --mqtt, --mqtt-user, --count, --dir, --history or an unsafe flag (it has no fence point and never sees command ids)")
		}
		id := "plc-1"
		if *f.devices != "" {
			id = strings.TrimSpace(*f.devices)
		}
		return runSerial(ctx, log, *f.port, id, *f.regs, *f.logPath, stdout)
	}
	if *f.fw.supervise || *f.fw.device != "" || *f.fw.inProcess || *f.fw.cDevice != "" {
		return runFirmware(ctx, log, fs, f, usage)
	}
	ids, err := deviceIDs(*f.devices, *f.count, *f.idPrefix)
	if msg := mqttUsage(fs, f, err); msg != "" {
		return usage(msg)
	}
	user, pass, err := mqttCredentials(*f.mqttUser, *f.mqttPassFile)
	if err != nil {
		return usage(err.Error())
	}
	return runFleet(ctx, log, f, ids, mqtt.Config{Username: user, Password: pass}, stdout)
}

// mqttUsage returns the usage error of a command line that runs devices
// on MQTT, or "": idsErr is deviceIDs's error, if it was called.
func mqttUsage(fs *flag.FlagSet, f devsimFlags, idsErr error) string {
	switch {
	case fs.NArg() > 0:
		return "unexpected arguments: " + strings.Join(fs.Args(), " ")
	case *f.broker == "":
		return "--mqtt is required"
	case *f.dir == "":
		return "--dir is required"
	case *f.lanes < 1 || *f.lanes > maxLanes:
		return fmt.Sprintf("--lanes %d: want 1 to %d", *f.lanes, maxLanes)
	case idsErr != nil:
		return idsErr.Error()
	}
	return ""
}

// maxLanes bounds --lanes: each lane is an MQTT connection.
const maxLanes = 256

// envMQTTPassword is the agent's variable for the MQTT password
// (agent.EnvMQTTPassword), read by devsim too.
const envMQTTPassword = "EDGEFENCE_MQTT_PASSWORD"

// mqttCredentials returns the user and the password of --mqtt-user: from
// passFile if given, else from $EDGEFENCE_MQTT_PASSWORD.
func mqttCredentials(user, passFile string) (string, []byte, error) {
	if user == "" {
		if passFile != "" {
			return "", nil, errors.New("--mqtt-password-file without --mqtt-user")
		}
		return "", nil, nil // no credentials: an anonymous client
	}
	pass := os.Getenv(envMQTTPassword)
	if passFile != "" {
		b, err := os.ReadFile(passFile)
		if err != nil {
			return "", nil, fmt.Errorf("--mqtt-password-file: %w", err)
		}
		pass = strings.TrimRight(string(b), "\r\n")
	}
	if pass == "" {
		return "", nil, fmt.Errorf("--mqtt-user %s: no password ($%s or --mqtt-password-file)", user, envMQTTPassword)
	}
	return user, []byte(pass), nil
}

// runFleet runs the MQTT devices ids until ctx ends.
func runFleet(ctx context.Context, log *slog.Logger, f devsimFlags, ids []string, creds mqtt.Config, stdout io.Writer) int {
	var vlog io.Writer = stdout
	if *f.logPath != "" {
		lf, err := os.OpenFile(*f.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			log.Error("open verdict log", "err", err)
			return 1
		}
		defer lf.Close()
		vlog = lf
	}
	var hist *history.Writer // nil: none
	if *f.histPath != "" {
		var err error
		if hist, err = history.Create(*f.histPath, *f.histSrc); err != nil {
			log.Error("open history", "err", err)
			return 1
		}
		defer hist.Close() // after the fleet: deferred calls run last in, first out
	}
	a, err := f.deviceAuth(ids)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	fleet, err := sim.NewFleet(ctx, sim.FleetConfig{Devices: ids, DataDir: *f.dir, Broker: *f.broker, Prefix: *f.prefix,
		ClientID: *f.clientID, VerdictLog: vlog, History: hist, Kind: deviceKind(*f.noFence), Logger: log, MQTT: creds, Keys: a.keys,
		Root: a.root, Signers: a.signers, Lanes: *f.lanes})
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	code := 0
	if err := fleet.AwaitReady(ctx); err == nil {
		log.Info("ready", "devices", len(ids), "broker", *f.broker, "prefix", *f.prefix, "user", creds.Username)
		<-ctx.Done()
	} else if ctx.Err() == nil {
		log.Error("await broker", "err", err)
		code = 1
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fleet.Close(sctx); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	st := fleet.Stats()
	log.Info("stopped", "accepted", st.Accepted, "duplicate", st.Duplicate, "stale", st.Stale, "invalid", st.Invalid,
		"mqtt_packets_oversize", st.PacketsOversize)
	return code
}

// deviceIDs returns the ids from --devices or --count (exactly one of them).
func deviceIDs(list string, count int, prefix string) ([]string, error) {
	switch {
	case list != "" && count != 0:
		return nil, errors.New("use --devices or --count, not both")
	case list != "":
		var ids []string
		for _, id := range strings.Split(list, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return nil, errors.New("--devices lists no device")
		}
		return ids, nil
	case count > 0:
		ids := make([]string, count)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s%d", prefix, i+1)
		}
		return ids, nil
	case count < 0:
		return nil, errors.New("--count must be positive")
	}
	return nil, errors.New("--devices or --count is required")
}
