package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefence/edgefence/devices/legacy"
	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/modbus"
	"github.com/edgefence/edgefence/transport/modbus/profile"
)

// Figure1Config sets up a replay of Figure 1 of the fencing article on real
// parts: two agent processes contend for the same devices, the holder is
// frozen past its lease, the other takes over, and the frozen one wakes up
// and sends the command it had queued.
type Figure1Config struct {
	AgentBin  string // the edgefence binary
	DevsimBin string // the edgefence-devsim binary
	// Device is what serves the MQTT devices: "" or DeviceDevsim, the Go
	// simulator (DevsimBin); DeviceC, the C device (CDeviceBin, efsdev:
	// devices/firmware's shim on libmosquitto, BuildCDevice). The C device
	// runs fenced MQTT devices: not with NoFence, Serial or Modbus; with
	// Trust it verifies commands against the kit's root and signs its acks
	// and state reports, as devsim.
	Device     string
	CDeviceBin string
	Dir        string // work dir: configs, data, logs, sockets (required)
	Etcd       string // etcd endpoint URL (required)
	MQTT       string // broker URL (required)

	Devices    []string      // default dev-1, dev-2, dev-3
	LeaseTTL   time.Duration // default 2s (the minimum)
	EtcdPrefix string        // default /edgefence/v1; distinct per run when runs share an etcd
	MQTTPrefix string        // default edgefence/v1

	// NoFence runs the device simulator with --unsafe-no-fence (unfenced
	// devices, sim.DeviceUnfenced), to show that without the fence the
	// same schedule corrupts the devices.
	NoFence bool
	// AgentAFailpoints is EDGEFENCE_FAILPOINTS for agent A; default
	// "ignore-session-loss", the frozen holder that never notices it was
	// deposed. Set to "none" for a normal agent.
	AgentAFailpoints string
	// Serial runs the scenario against a legacy device that cannot check
	// tokens: one register device (edgefence-devsim --serial) on a pty pair,
	// wired to agent B, its home gateway, whose fence table is the fence.
	// Commands are write_register to register 0; Devices must be one id.
	// With NoFence, B runs with its fence table off.
	Serial bool
	// Modbus runs the scenario against a unit on a Modbus bus, RTU or TCP,
	// wired to agent B, its home gateway (figure1modbus.go); Devices must
	// be one id, DevsimBin is not needed. With NoFence, B runs with its
	// fence table off.
	Modbus *Figure1Modbus

	// RestartDevicesBeforeLate kills the device simulator with SIGKILL and
	// starts it again on the same data before A's late command arrives.
	RestartDevicesBeforeLate bool

	// Auth, when the broker at MQTT requires credentials (BrokerConfig.Auth),
	// is that broker's: the run adds its users gw-a, gw-b (gateways; gw-b the
	// home of the Serial device) and devsim (the MQTT devices) and their
	// rules under MQTTPrefix, and every process logs in as its user. nil:
	// everyone connects anonymously.
	Auth *BrokerAuth

	// Trust, if set, signs the run (invariant I7): gw-a and gw-b get
	// signing keys certified by it for the devices, and the devices
	// (edgefence-devsim or efsdev --trust-root --certs --device-keys)
	// accept only commands they signed and sign their acks and reports. A kit serves one run. With Serial the device is `auth: off`
	// (B's fence table knows only B's own certificate).
	Trust *TrustKit
	// Forgery, with Trust and not Serial, adds a scene after B's command
	// (forgery.go): a broker client publishes an unsigned envelope with
	// token 2^63 to the first device; the run records what became of it
	// (Figure1Result.Forgery).
	Forgery bool

	Narrate io.Writer // the timeline in plain words; nil = discard
}

// Values the scenario writes to each device's setpoint.
const (
	SetpointA    = 21.0 // A's first command, while it holds the lease
	SetpointB    = 25.0 // B's command after taking over
	SetpointLate = 99.0 // A's command, queued before the freeze, sent after it
)

// Figure1Result is what happened, read back from the agents' answers and the
// devices' verdict log.
type Figure1Result struct {
	TokenA, TokenB map[string]fence.Token // per device
	First          map[string]SendResult  // A's first command per device
	Takeover       map[string]SendResult  // B's command per device
	Late           map[string]SendResult  // A's late command per device
	Verdicts       []sim.VerdictRecord    // the devices' verdict log, in order
	Final          map[string]sim.State   // each device's state at the end (MQTT devices)
	Values         map[string]float64     // each device's final value: setpoint, register 0 (Serial), or the slave's field (Modbus)
	Registers      []uint16               // the slave's registers of the field, read back at the end (Modbus)
	Applied        []legacy.Applied       // the legacy device's applied writes (Serial)
	Frozen         time.Duration          // how long A was frozen
	Forgery        *ForgeryResult         // the forgery scene's outcome (Figure1Config.Forgery)
}

// SendResult is the output of `edgefence send`.
type SendResult struct {
	Device  string `json:"device"`
	Token   uint64 `json:"token,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	Verdict string `json:"verdict,omitempty"`
	Error   string `json:"error,omitempty"`
	Exit    int    `json:"-"`
}

type agentStatus struct {
	Devices []struct {
		ID    string      `json:"id"`
		State string      `json:"state"`
		Token fence.Token `json:"token"`
	} `json:"devices"`
	Etcd struct {
		Session bool `json:"session"`
	} `json:"etcd"`
	Transport map[string]any `json:"transport"`
	Jobs      *struct {
		Steps map[string]map[string]uint64 `json:"steps"`
	} `json:"jobs"`
}

type figure1 struct {
	cfg     Figure1Config
	start   time.Time
	procs   []*Proc
	pair    *PtyPair               // Serial: gateway end A... device end B
	keys    map[string]*GatewayKey // Trust: gw-a's and gw-b's signing keys
	devKeys string                 // Trust, MQTT devices: their own keys (edgefence-devsim --device-keys)
	prof    *profile.Profile       // Modbus: the device's profile
	field   *profile.Field         // Modbus: the field the commands set
}

// RunFigure1 runs the scenario and returns what happened. It stops every
// process it started before returning.
func RunFigure1(ctx context.Context, cfg Figure1Config) (*Figure1Result, error) {
	if cfg.Dir == "" || cfg.Etcd == "" || cfg.MQTT == "" || cfg.AgentBin == "" || (cfg.DevsimBin == "" && cfg.Modbus == nil && cfg.Device != DeviceC) {
		return nil, errors.New("sandbox: figure 1: Dir, Etcd, MQTT, AgentBin and DevsimBin are required")
	}
	if err := cfg.checkDevice(); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	if cfg.Serial && len(cfg.Devices) != 1 {
		return nil, errors.New("sandbox: figure 1 over serial takes one device")
	}
	f := &figure1{cfg: cfg, start: time.Now()}
	defer f.stopAll()
	if err := f.checkModbus(); err != nil {
		return nil, err
	}
	if err := f.addUsers(); err != nil {
		return nil, err
	}
	if err := f.provisionTrust(ctx); err != nil {
		return nil, err
	}
	if cfg.Serial {
		pair, err := NewPtyPair()
		if err != nil {
			return nil, err
		}
		f.pair = pair
		defer pair.Close()
	}
	return f.run(ctx)
}

// Figure1Config.Device values.
const (
	DeviceDevsim = "devsim" // edgefence-devsim (the default)
	DeviceC      = "c"      // efsdev, the C device (BuildCDevice)
)

// checkDevice refuses a Device the run cannot use.
func (cfg *Figure1Config) checkDevice() error {
	switch cfg.Device {
	case "", DeviceDevsim:
		return nil
	case DeviceC:
		if cfg.CDeviceBin == "" {
			return errors.New("sandbox: figure 1: Device c needs CDeviceBin")
		}
		if cfg.NoFence || cfg.Serial || cfg.Modbus != nil {
			return errors.New("sandbox: figure 1: the C device runs fenced MQTT devices (not NoFence, Serial or Modbus)")
		}
		return nil
	}
	return fmt.Errorf("sandbox: figure 1: unknown Device %q (want %q or %q)", cfg.Device, DeviceDevsim, DeviceC)
}

// applyDefaults fills in the defaults of the fields left zero.
func (cfg *Figure1Config) applyDefaults() {
	if len(cfg.Devices) == 0 {
		cfg.Devices = []string{"dev-1", "dev-2", "dev-3"}
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.EtcdPrefix == "" {
		cfg.EtcdPrefix = "/edgefence/v1"
	}
	if cfg.MQTTPrefix == "" {
		cfg.MQTTPrefix = "edgefence/v1"
	}
	if cfg.AgentAFailpoints == "" {
		cfg.AgentAFailpoints = "ignore-session-loss"
	}
	if cfg.Narrate == nil {
		cfg.Narrate = io.Discard
	}
}

func (f *figure1) say(format string, args ...any) {
	fmt.Fprintf(f.cfg.Narrate, "[%6.2fs] %s\n", time.Since(f.start).Seconds(), fmt.Sprintf(format, args...))
}

func (f *figure1) stopAll() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		_ = f.procs[i].Stop(10 * time.Second)
	}
}

func (f *figure1) path(name string) string { return filepath.Join(f.cfg.Dir, name) }

func (f *figure1) startDevices(ctx context.Context) (*Proc, error) {
	if f.cfg.Modbus != nil {
		return nil, nil // the caller's slave
	}
	if f.cfg.Serial {
		p, err := StartProc("devsim", f.path("devsim.log"), nil, f.cfg.DevsimBin,
			"--serial", f.pair.B, "--devices", f.cfg.Devices[0], "--log", f.path("applied.jsonl"))
		if err != nil {
			return nil, err
		}
		f.procs = append(f.procs, p)
		return p, p.WaitLine(ctx, "ready")
	}
	args := []string{"--mqtt", f.cfg.MQTT, "--prefix", f.cfg.MQTTPrefix, "--devices", strings.Join(f.cfg.Devices, ","),
		"--dir", f.path("devices"), "--log", f.path("verdicts.jsonl"), "--client-id", "devsim-" + filepath.Base(f.cfg.Dir)}
	bin := f.cfg.DevsimBin
	if f.cfg.Device == DeviceC {
		bin = f.cfg.CDeviceBin
	}
	if f.cfg.NoFence {
		args = append(args, "--unsafe-no-fence")
	}
	if f.cfg.Trust != nil {
		args = append(args, f.cfg.Trust.DevsimArgs("")...)
		if f.devKeys != "" {
			args = append(args, "--device-keys", f.devKeys)
		}
	}
	user, env, err := f.login("devsim")
	if err != nil {
		return nil, err
	}
	if user != "" {
		args = append(args, "--mqtt-user", user)
	}
	p, err := StartProc("devsim", f.path("devsim.log"), env, bin, args...)
	if err != nil {
		return nil, err
	}
	f.procs = append(f.procs, p)
	if err := p.WaitLine(ctx, "ready"); err != nil {
		return nil, err
	}
	return p, nil
}

func (f *figure1) startAgent(ctx context.Context, gw, failpoints string) (*Proc, string, error) {
	sock := f.path(gw + ".sock")
	var devs strings.Builder
	for _, d := range f.cfg.Devices {
		fmt.Fprintf(&devs, "  - id: %s\n", d)
		if f.cfg.atGateway() {
			// B is the home gateway: the device is wired to it.
			fmt.Fprintf(&devs, "    fence: gateway\n    home: gw-b\n")
			if gw == "gw-b" && f.cfg.Serial {
				fmt.Fprintf(&devs, "    serial:\n      port: %s\n", f.pair.A)
			}
			if gw == "gw-b" && f.cfg.Modbus != nil {
				devs.WriteString(f.modbusDeviceYAML())
			}
		}
		if f.cfg.Trust == nil || f.cfg.atGateway() {
			// Unsigned, said explicitly; at B's table, signed would need
			// every gateway's certificate there, and it knows only B's.
			devs.WriteString("    auth: off\n")
		}
	}
	user, env, err := f.login(gw)
	if err != nil {
		return nil, "", err
	}
	if user != "" {
		user = "\n  username: " + user // the password is in env
	}
	conf := fmt.Sprintf(`gateway: %s
state_dir: %s
etcd:
  endpoints: [%s]
  prefix: %s
  lease_ttl: %s
mqtt:
  brokers: [%s]
  prefix: %s
  client_id: %s%s
api:
  socket: %s
command:
  timeout: 20s
log:
  level: info
  format: json
%s%sdevices:
%s`, gw, f.path(gw+"-state"), f.cfg.Etcd, f.cfg.EtcdPrefix, f.cfg.LeaseTTL, f.cfg.MQTT, f.cfg.MQTTPrefix,
		gw+"-"+filepath.Base(f.cfg.Dir), user, sock, authYAML(f.keys[gw]), f.modbusYAML(gw), devs.String())
	cpath := f.path(gw + ".yaml")
	if err := os.WriteFile(cpath, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	if failpoints != "" && failpoints != "none" {
		env = append(env, "EDGEFENCE_FAILPOINTS="+failpoints)
	}
	p, err := StartProc(gw, f.path(gw+".log"), env, f.cfg.AgentBin, "run", "--config", cpath)
	if err != nil {
		return nil, "", err
	}
	f.procs = append(f.procs, p)
	return p, sock, nil
}

// login returns the MQTT user of a figure-1 process and the environment
// holding its password ($EDGEFENCE_MQTT_PASSWORD, read by the agent and by
// devsim), or nothing when the broker is anonymous.
func (f *figure1) login(user string) (string, []string, error) {
	if f.cfg.Auth == nil {
		return "", nil, nil
	}
	pass, err := f.cfg.Auth.User(user)
	if err != nil {
		return "", nil, err
	}
	return user, []string{"EDGEFENCE_MQTT_PASSWORD=" + pass}, nil
}

// addUsers adds the run's users and rules to Auth: gateways gw-a and gw-b
// (gw-b the home of a Serial or Modbus device) and devsim, serving the MQTT
// devices.
func (f *figure1) addUsers() error {
	if f.cfg.Auth == nil {
		return nil
	}
	p := f.cfg.MQTTPrefix
	acl := GatewayACL(p, "gw-a")
	if f.cfg.atGateway() {
		acl += GatewayACL(p, "gw-b", f.cfg.Devices...)
	} else {
		acl += GatewayACL(p, "gw-b") + FleetACL(p, "devsim", f.cfg.Devices...)
	}
	return f.cfg.Auth.AddACL(acl)
}

// status runs `edgefence status --json`.
func (f *figure1) status(ctx context.Context, sock string) (*agentStatus, error) {
	out, err := exec.CommandContext(ctx, f.cfg.AgentBin, "status", "--json", "--socket", sock).Output()
	if err != nil {
		return nil, err
	}
	var st agentStatus
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("status output: %w", err)
	}
	return &st, nil
}

// waitHolding polls the agent until it holds every device, and returns the
// tokens.
func (f *figure1) waitHolding(ctx context.Context, p *Proc, sock string) (map[string]fence.Token, error) {
	toks := map[string]fence.Token{}
	err := f.waitStatus(ctx, p, sock, "hold every device", func(st *agentStatus) bool {
		clear(toks)
		for _, d := range st.Devices {
			if d.State == "holding" {
				toks[d.ID] = d.Token
			}
		}
		return len(toks) == len(f.cfg.Devices)
	})
	return toks, err
}

// waitUp polls the agent until its etcd session is open and, with bridge,
// until the broker acknowledged its subscriptions (the bridge's command
// topics among them): its status, not its log, says so.
func (f *figure1) waitUp(ctx context.Context, p *Proc, sock string, bridge bool) error {
	return f.waitStatus(ctx, p, sock, "come up", func(st *agentStatus) bool {
		return st.Etcd.Session && (!bridge || st.Transport["subscribed"] == true)
	})
}

// waitStatus polls the agent's status until ok says so.
func (f *figure1) waitStatus(ctx context.Context, p *Proc, sock, what string, ok func(*agentStatus) bool) error {
	for {
		if st, err := f.status(ctx, sock); err == nil && ok(st) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not %s: %w", p.Name, what, ctx.Err())
		case <-p.Done():
			return fmt.Errorf("%s exited", p.Name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// send runs `edgefence send` and parses its answer.
func (f *figure1) send(ctx context.Context, sock, dev string, setpoint float64) (SendResult, error) {
	kind, body := "set", fmt.Sprintf(`{"setpoint": %g}`, setpoint)
	if f.cfg.Serial {
		kind, body = modbus.KindWriteRegister, fmt.Sprintf(`{"addr": 0, "value": %g}`, setpoint)
	}
	if f.cfg.Modbus != nil {
		kind, body = kindTwinSet, fmt.Sprintf(`{%q: %g}`, f.cfg.Modbus.Field, setpoint)
	}
	return f.sendKind(ctx, sock, dev, kind, body)
}

// sendKind runs `edgefence send --json` of kind with the JSON body and
// parses its answer.
func (f *figure1) sendKind(ctx context.Context, sock, dev, kind, body string) (SendResult, error) {
	cmd := exec.CommandContext(ctx, f.cfg.AgentBin, "send", "--json", "--socket", sock, dev, kind, body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res SendResult
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return res, fmt.Errorf("edgefence send %s: %v: %s%s", dev, err, out, stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.Exit = ee.ExitCode()
	}
	return res, nil
}

func (f *figure1) run(ctx context.Context) (*Figure1Result, error) {
	c := f.cfg
	res := &Figure1Result{First: map[string]SendResult{}, Takeover: map[string]SendResult{}, Late: map[string]SendResult{}}
	p, err := f.startAll(ctx, res)
	if err != nil {
		return nil, err
	}
	if err := f.sendAll(ctx, p.sockA, SetpointA, res.First); err != nil {
		return nil, err
	}
	f.say("A sets setpoint=%g on each device: %s", SetpointA, fmtVerdicts(c.Devices, res.First))

	if err := p.a.Freeze(); err != nil {
		return nil, err
	}
	frozeAt := time.Now()
	f.say("A is frozen (SIGSTOP) — a GC pause, a throttled container; its lease will expire while it sleeps")
	lateC := f.sendLate(ctx, p.sockA)
	f.say("A's next command (setpoint=%g) is queued inside the frozen A", SetpointLate)

	if err := f.takeOver(ctx, p, res); err != nil {
		return nil, err
	}
	if err := p.a.Resume(); err != nil {
		return nil, err
	}
	res.Frozen = time.Since(frozeAt)
	f.say("A wakes up (SIGCONT) after %.1fs, still believing it holds the lease, and sends its queued command", res.Frozen.Seconds())
	for range c.Devices {
		select {
		case l := <-lateC:
			if l.err != nil {
				return nil, l.err
			}
			res.Late[l.dev] = l.r
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.say("A's late command (token %s): %s", fmtTokens(c.Devices, res.TokenA), fmtVerdicts(c.Devices, res.Late))
	if err := f.finish(ctx, res); err != nil {
		return nil, err
	}
	return res, nil
}

// figure1Procs are the processes of one run.
type figure1Procs struct {
	devsim, a, b *Proc
	sockA, sockB string
}

// startAll starts the devices, agent A (until it holds every device) and
// agent B (until it is up and campaigning).
func (f *figure1) startAll(ctx context.Context, res *Figure1Result) (*figure1Procs, error) {
	c := f.cfg
	fenceWord := "fenced"
	switch {
	case c.Serial && c.NoFence:
		fenceWord = "a legacy serial device wired to gateway B, whose fence table is OFF"
	case c.Serial:
		fenceWord = "a legacy serial device (no fence of its own) wired to gateway B, whose fence table guards it"
	case c.Modbus != nil && c.NoFence:
		fenceWord = "a Modbus slave, " + f.modbusWhere() + ", wired to gateway B, whose fence table is OFF"
	case c.Modbus != nil:
		fenceWord = "a Modbus slave (no fence of its own), " + f.modbusWhere() + ", wired to gateway B, whose fence table guards it"
	case c.NoFence:
		fenceWord = "UNFENCED (--unsafe-no-fence: they apply whatever arrives)"
	case c.Device == DeviceC:
		fenceWord = "fenced by the C firmware shim (efsdev on libmosquitto, marks on its flash file)"
	}
	if c.Trust != nil && !c.atGateway() {
		fenceWord += ", taking only commands signed by a gateway key the operator certified (gw-a/1, gw-b/1)"
	}
	p := &figure1Procs{}
	var err error
	if p.devsim, err = f.startDevices(ctx); err != nil {
		return nil, err
	}
	f.say("devices %s are up, %s", strings.Join(c.Devices, ", "), fenceWord)

	if p.a, p.sockA, err = f.startAgent(ctx, "gw-a", c.AgentAFailpoints); err != nil {
		return nil, err
	}
	if res.TokenA, err = f.waitHolding(ctx, p.a, p.sockA); err != nil {
		return nil, err
	}
	f.say("agent A holds the lease of every device (lease TTL %v), tokens %s", c.LeaseTTL, fmtTokens(c.Devices, res.TokenA))

	bFailpoints := ""
	if c.atGateway() && c.NoFence {
		bFailpoints = "no-fence-table" // B is the device's home: its table is the fence
	}
	if p.b, p.sockB, err = f.startAgent(ctx, "gw-b", bFailpoints); err != nil {
		return nil, err
	}
	if err := f.waitUp(ctx, p.b, p.sockB, c.atGateway()); err != nil {
		return nil, err
	}
	f.say("agent B is up and campaigning for the same devices")
	return p, nil
}

// sendAll sends setpoint to every device through the agent at sock.
func (f *figure1) sendAll(ctx context.Context, sock string, setpoint float64, into map[string]SendResult) error {
	for _, d := range f.cfg.Devices {
		r, err := f.send(ctx, sock, d, setpoint)
		if err != nil {
			return err
		}
		into[d] = r
	}
	return nil
}

// lateSend is the outcome of one of A's late commands.
type lateSend struct {
	dev string
	r   SendResult
	err error
}

// sendLate sends SetpointLate to every device through the frozen A: the
// commands wait in its API socket, decided while A still believed it held
// the lease.
func (f *figure1) sendLate(ctx context.Context, sockA string) <-chan lateSend {
	lateC := make(chan lateSend, len(f.cfg.Devices))
	for _, d := range f.cfg.Devices {
		go func() {
			r, err := f.send(ctx, sockA, d, SetpointLate)
			lateC <- lateSend{d, r, err}
		}()
	}
	return lateC
}

// takeOver waits until B holds every device with higher tokens, has B
// command them, and restarts the devices if the run asks for it.
func (f *figure1) takeOver(ctx context.Context, p *figure1Procs, res *Figure1Result) error {
	c := f.cfg
	var err error
	if res.TokenB, err = f.waitHolding(ctx, p.b, p.sockB); err != nil {
		return err
	}
	f.say("A's lease expired; B acquired every device with higher tokens %s", fmtTokens(c.Devices, res.TokenB))
	if err := f.sendAll(ctx, p.sockB, SetpointB, res.Takeover); err != nil {
		return err
	}
	f.say("B sets setpoint=%g: %s", SetpointB, fmtVerdicts(c.Devices, res.Takeover))
	if c.Forgery {
		if err := f.forge(ctx, p, res); err != nil {
			return err
		}
	}
	if !c.RestartDevicesBeforeLate {
		return nil
	}
	if err := p.devsim.Kill(); err != nil {
		return err
	}
	f.say("the devices crash (SIGKILL) and restart on their stored state")
	_, err = f.startDevices(ctx)
	return err
}

// finish stops everything so the device logs are complete, then reads the
// devices' final values from them.
func (f *figure1) finish(ctx context.Context, res *Figure1Result) error {
	f.stopAll()
	f.procs = nil
	res.Values = map[string]float64{}
	if f.cfg.Modbus != nil {
		if err := f.readModbus(ctx, res); err != nil {
			return err
		}
	} else if f.cfg.Serial {
		if err := f.readApplied(res); err != nil {
			return err
		}
	} else if err := f.readVerdicts(res); err != nil {
		return err
	}
	var finals []string
	for _, d := range f.cfg.Devices {
		finals = append(finals, fmt.Sprintf("%s=%g", d, res.Values[d]))
	}
	f.say("final values: %s", strings.Join(finals, " "))
	return nil
}

func (f *figure1) readVerdicts(res *Figure1Result) error {
	lf, err := os.Open(f.path("verdicts.jsonl"))
	if err != nil {
		return err
	}
	defer lf.Close()
	if res.Verdicts, err = sim.ReadVerdictLog(lf); err != nil {
		return err
	}
	res.Final = map[string]sim.State{}
	for _, v := range res.Verdicts {
		if v.State != nil {
			res.Final[v.Device] = *v.State
			res.Values[v.Device] = v.State.Setpoint
		}
	}
	return nil
}

func (f *figure1) readApplied(res *Figure1Result) error {
	lf, err := os.Open(f.path("applied.jsonl"))
	if err != nil {
		return err
	}
	defer lf.Close()
	if res.Applied, err = legacy.ReadApplied(lf); err != nil {
		return err
	}
	for _, a := range res.Applied {
		if a.Addr == 0 && len(a.Values) > 0 {
			res.Values[a.Device] = float64(a.Values[0])
		}
	}
	return nil
}

func fmtTokens(devs []string, t map[string]fence.Token) string {
	var s []string
	for _, d := range devs {
		s = append(s, fmt.Sprintf("%s:%d", d, t[d]))
	}
	return strings.Join(s, " ")
}

func fmtVerdicts(devs []string, r map[string]SendResult) string {
	var s []string
	for _, d := range devs {
		v := r[d].Verdict
		if v == "" {
			v = "refused by agent: " + r[d].Error
		}
		s = append(s, d+" "+v)
	}
	return strings.Join(s, ", ")
}

// CheckFenced verifies the outcome a fenced run must have: B's tokens are
// above A's; every command of A before the freeze and of B was accepted;
// every late command of A was refused (stale at the device, or by A itself
// if it noticed its loss); no device holds the late value; and every command
// in the verdict log has a verdict.
func (r *Figure1Result) CheckFenced() error {
	var errs []error
	for d, tb := range r.TokenB {
		if tb <= r.TokenA[d] {
			errs = append(errs, fmt.Errorf("%s: B's token %d not above A's %d", d, tb, r.TokenA[d]))
		}
		if v := r.First[d].Verdict; v != "accepted" {
			errs = append(errs, fmt.Errorf("%s: A's first command: %q %s", d, v, r.First[d].Error))
		}
		if v := r.Takeover[d].Verdict; v != "accepted" {
			errs = append(errs, fmt.Errorf("%s: B's command: %q %s", d, v, r.Takeover[d].Error))
		}
		if v := r.Late[d].Verdict; v == "accepted" || v == "duplicate" {
			errs = append(errs, fmt.Errorf("%s: A's late command was %s", d, v))
		}
		if s := r.Values[d]; s != SetpointB {
			errs = append(errs, fmt.Errorf("%s: final value %g, want B's %g", d, s, SetpointB))
		}
	}
	if r.Forgery != nil {
		errs = append(errs, r.Forgery.Check())
	}
	// I1 on the device's own history: accepted tokens never decrease.
	max := map[string]fence.Token{}
	for _, v := range r.Verdicts {
		if v.Verdict != fence.Accepted {
			continue
		}
		if v.Token < max[v.Device] {
			errs = append(errs, fmt.Errorf("%s: accepted token %d after %d", v.Device, v.Token, max[v.Device]))
		}
		max[v.Device] = v.Token
	}
	return errors.Join(errs...)
}

// Corrupted counts the devices whose final setpoint is the stale holder's.
func (r *Figure1Result) Corrupted() int {
	n := 0
	for _, v := range r.Values {
		if v == SetpointLate {
			n++
		}
	}
	return n
}
