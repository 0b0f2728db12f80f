// Package chaos is edgefence's fault-injection suite: it runs the real
// binaries — two agents (`edgefence run`) competing for the same devices,
// the device simulator with its shims (`edgefence-devsim`), legacy serial
// devices behind a home gateway's fence table — against a real etcd and a
// real MQTT broker, drives commands at them, injects one kind of fault at
// randomized moments, heals, waits until every command has its terminal
// state, and checks the recorded histories (package fence/history):
//
//   - I1: per device, the tokens a fence point accepted never decrease, and
//     nothing below an accepted token is accepted again;
//   - I4: every command an agent created has exactly one terminal state;
//   - T1 (history.InvariantRevocation): nothing signed by a revoked key is
//     accepted at a fence point after it recorded the revocation;
//   - in the firmware round, FW1 (history.InvariantActivation: one
//     fw.activate accepted per job per device), FW2 (every device
//     committed on the job's image) and FW3 (every execution succeeded);
//   - after the faults (liveness.go): L1, within LivenessBound every device
//     is held by a gateway that can command it and a command to it is
//     accepted; L2, no command of a never-revoked gateway ends invalid
//     for want of trust.
//
// Rounds run signed (trust.go): an operator root, a key and certificate
// per gateway, every device `auth: required`, the shim devices provisioned
// with the root and their own keys (Config.Unsigned: plain).
//
// Faults (Scenarios): a holder frozen with SIGSTOP past its lease; kill -9
// of an agent, of the device simulator, of the home gateway (bridge); etcd
// stopped and restarted; a 3-member etcd cluster losing its leader; the
// broker restarted without persistence; a partition between a gateway and
// etcd + broker made with network namespaces; QoS 1 duplicates injected by
// the broker; noise on the serial line; a firmware job over firmware device
// processes while its holders are frozen or killed and its devices lose
// power (FaultFirmware: several faults, fwfaults.go); and the trust faults
// (trustfaults.go): devices offline when a gateway acquires them, etcd
// wiped and recovered by the runbook, a gateway's key revoked, a key
// rotated and the old one revoked.
//
// `make chaos ROUNDS=N` runs N randomized rounds (cmd/edgefence-chaos) and
// prints a summary; `make test` runs each scenario once (chaos_test.go).
package chaos

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence/history"
)

// Fault kinds, as counted in a Result.
const (
	FaultFreeze      = "holder-sigstop"
	FaultKillAgent   = "kill-agent"
	FaultKillDevsim  = "kill-devsim"
	FaultKillBridge  = "kill-bridge"
	FaultEtcdRestart = "etcd-restart"
	FaultLeaderLoss  = "etcd-leader-loss"
	FaultBroker      = "broker-restart"
	FaultPartition   = "partition"
	FaultDuplicate   = "qos1-duplicate"
	FaultSerialNoise = "serial-noise"
	// FaultFirmware is the firmware scenario: a firmware job over every
	// device while its holder is frozen or killed and device processes
	// lose power (FaultFreeze, FaultKillAgent, FaultKillDevice).
	FaultFirmware = "firmware-failover"
	// FaultKillDevice is kill -9 of one firmware device's process (a
	// power loss), in the firmware scenario.
	FaultKillDevice = "kill-device"
	// FaultOffline: the devices are down when a gateway acquires them
	// and come back on a fresh MQTT session (trustfaults.go).
	FaultOffline = "device-offline-at-acquisition"
	// FaultEtcdRebuilt: etcd wiped mid-run, the trust put back by the
	// agents, the token regression recovered by the runbook
	// (FaultRecovered: `edgefence etcd bump-revision`).
	FaultEtcdRebuilt = "etcd-rebuilt"
	FaultRecovered   = "runbook-recovery"
	// FaultRevoked: a gateway's key revoked mid-run (signed rounds).
	FaultRevoked = "gateway-revoked"
	// FaultRotated: a gateway's key rotated and the old one revoked
	// mid-run (signed rounds).
	FaultRotated = "key-rotated"
	// FaultLate: a command signed by a revoked key sent to a device
	// that learned the revocation (gateway-revoked, key-rotated).
	FaultLate = "late-revoked-command"
)

// Invariants a round checks besides the history's (history.Invariant*),
// reported as Violations in Result.Report.
const (
	// InvariantLiveness (L1): within LivenessBound of the end of the
	// faults every device is held by a gateway that can command it — by
	// the operator's records its key is certified for the device and not
	// revoked, and its own status says its certificate is OK — and a
	// command sent to it is accepted.
	InvariantLiveness = "L1"
	// InvariantTrustDelivered (L2): no command of a gateway whose key
	// was never revoked ends invalid for want of trust (a reason of
	// fence/auth: unknown signer key, and the like): the device got the
	// certificate it needed, whenever it connected.
	InvariantTrustDelivered = "L2"
)

// LivenessBound bounds L1: from the end of the faults (healed, and
// recovered by the runbook where the round needs it) until every device
// is held by a gateway that can command it with a command accepted. It
// covers a lease TTL, an untrusted or refused device's campaign backoff
// (at most 30 s) and the commands queued before the probe.
const LivenessBound = 60 * time.Second

// signedOnly are the scenarios that need a signed round.
var signedOnly = []string{FaultRevoked, FaultRotated}

// Scenarios lists the scenario names, one per fault kind.
func Scenarios() []string {
	return []string{FaultFreeze, FaultKillAgent, FaultKillDevsim, FaultKillBridge, FaultEtcdRestart,
		FaultLeaderLoss, FaultBroker, FaultPartition, FaultDuplicate, FaultSerialNoise, FaultFirmware,
		FaultOffline, FaultEtcdRebuilt, FaultRevoked, FaultRotated}
}

// UnsignedScenarios lists the scenarios an unsigned round can run (all
// but the trust ones).
func UnsignedScenarios() []string {
	var out []string
	for _, s := range Scenarios() {
		if !slices.Contains(signedOnly, s) {
			out = append(out, s)
		}
	}
	return out
}

// Config configures a round. Bin and Dir are required.
type Config struct {
	// Bin is the directory holding the edgefence, edgefence-devsim and (for
	// the partition scenario) edgefence-sandbox binaries.
	Bin string
	// Dir is the round's working directory (configs, state, logs,
	// histories).
	Dir string
	// CDeviceBin, if set, is the C device (efsdev, sandbox.BuildCDevice):
	// it serves the shim devices in place of edgefence-devsim, its fence
	// point the C library's (the firmware round's devices stay devsim's).
	CDeviceBin string
	// Devices is the number of shim devices (MQTT); default 4.
	Devices int
	// Serial is the number of legacy serial devices behind gateway gw-b's
	// fence table; default 1 (2 in the serial scenarios).
	Serial int
	// TTL is the agents' lease TTL (whole seconds); default 2s.
	TTL time.Duration
	// Load is how long commands flow while the fault is injected; default
	// 6s.
	Load time.Duration
	// Pause is the pause between two commands to one device; default 40ms.
	Pause time.Duration
	// Outage overrides the randomized duration of the fault (an outage,
	// a freeze) when positive.
	Outage time.Duration
	// Seed drives every random choice of the round.
	Seed uint64
	// Logger narrates the round; nil is silent.
	Logger *slog.Logger
	// Unsigned runs the round without trust: plain envelopes, `auth: off`
	// devices. By default a round is signed: an operator root, a key and
	// certificate per gateway, every device `auth: required`, the shim
	// devices provisioned with the root and their own keys (trust.go).
	Unsigned bool
}

func (c *Config) defaults() {
	if c.Devices <= 0 {
		c.Devices = 4
	}
	if c.Serial <= 0 {
		c.Serial = 1
	}
	if c.TTL <= 0 {
		c.TTL = 2 * time.Second
	}
	if c.Load <= 0 {
		c.Load = 6 * time.Second
	}
	if c.Pause <= 0 {
		c.Pause = 40 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Result is what one round did and found.
type Result struct {
	Scenario string
	Seed     uint64
	Faults   map[string]int // faults injected, per kind
	Sends    int            // commands the load asked for (some refused: not the holder)
	Report   history.Report // the checker's verdict on the round's history
	Elapsed  time.Duration

	// Events is the round's whole history, as checked.
	Events []history.Event
	// FaultStart and FaultEnd bracket the (last) injected fault; in the
	// firmware scenario, all of them.
	FaultStart, FaultEnd time.Time
	// Executions counts the firmware job's executions by final status
	// (firmware scenario only).
	Executions map[string]int
	// Signed says the round ran signed (not Config.Unsigned).
	Signed bool
	// Settled is how long after the end of the faults the last device
	// was held by a gateway that can command it with a command accepted
	// (L1; not measured in the firmware scenario).
	Settled time.Duration
}

// OK reports whether the round found no violation.
func (r *Result) OK() bool { return r.Report.OK() }

// Count returns the number of terminal states v (e.g. "accepted").
func (r *Result) Count(v string) int { return r.Report.Terminal[v] }

// Summary accumulates rounds for the table `make chaos` prints.
type Summary struct {
	Signed     int // rounds that ran signed
	Rounds     int
	Failed     int // rounds that could not run to the end (an error, not a violation)
	Faults     map[string]int
	Created    int
	Terminal   map[string]int
	Violations int
	Elapsed    time.Duration
	Errors     []string
	// Settled is the longest Result.Settled: the slowest return to every
	// device commanded after the faults (L1).
	Settled time.Duration
}

// Add counts one round (res may be nil if the round failed with err).
func (s *Summary) Add(res *Result, err error) {
	if s.Faults == nil {
		s.Faults, s.Terminal = map[string]int{}, map[string]int{}
	}
	s.Rounds++
	if err != nil {
		s.Failed++
		s.Errors = append(s.Errors, err.Error())
	}
	if res == nil {
		return
	}
	if res.Signed {
		s.Signed++
	}
	for k, n := range res.Faults {
		s.Faults[k] += n
	}
	s.Created += res.Report.Created
	for k, n := range res.Report.Terminal {
		s.Terminal[k] += n
	}
	s.Violations += len(res.Report.Violations)
	s.Elapsed += res.Elapsed
	s.Settled = max(s.Settled, res.Settled)
}

// Print writes the summary table.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "rounds           %d (%d could not finish), %d signed (operator root, gateway certificates, devices auth: required)\n",
		s.Rounds, s.Failed, s.Signed)
	fmt.Fprintf(w, "elapsed          %v\n", s.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "faults injected\n")
	kinds := make([]string, 0, len(s.Faults))
	for k := range s.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-29s %d\n", k, s.Faults[k])
	}
	fmt.Fprintf(w, "commands created %d\n", s.Created)
	for _, v := range []string{"accepted", "duplicate", "stale", "invalid", "expired"} {
		fmt.Fprintf(w, "  %-18s %d\n", v, s.Terminal[v])
	}
	var other []string
	for k, n := range s.Terminal {
		if !slices.Contains([]string{"accepted", "duplicate", "stale", "invalid", "expired"}, k) {
			other = append(other, fmt.Sprintf("%s=%d", k, n))
		}
	}
	if len(other) > 0 {
		fmt.Fprintf(w, "  other            %s\n", strings.Join(other, " "))
	}
	fmt.Fprintf(w, "violations       %d\n", s.Violations)
	fmt.Fprintf(w, "settled          every device commanded again at most %v after the faults ended (L1 bound %v)\n",
		s.Settled.Round(100*time.Millisecond), LivenessBound)
	for i, e := range s.Errors {
		if i == 10 {
			fmt.Fprintf(w, "  ... %d more errors\n", len(s.Errors)-10)
			break
		}
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
