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
//   - in the firmware round, FW1 (history.InvariantActivation: one
//     fw.activate accepted per job per device), FW2 (every device
//     committed on the job's image) and FW3 (every execution succeeded).
//
// Faults (Scenarios): a holder frozen with SIGSTOP past its lease; kill -9
// of an agent, of the device simulator, of the home gateway (bridge); etcd
// stopped and restarted; a 3-member etcd cluster losing its leader; the
// broker restarted without persistence; a partition between a gateway and
// etcd + broker made with network namespaces; QoS 1 duplicates injected by
// the broker; noise on the serial line; a firmware job over firmware device
// processes while its holders are frozen or killed and its devices lose
// power (FaultFirmware: several faults, fwfaults.go).
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
)

// Scenarios lists the scenario names, one per fault kind.
func Scenarios() []string {
	return []string{FaultFreeze, FaultKillAgent, FaultKillDevsim, FaultKillBridge, FaultEtcdRestart,
		FaultLeaderLoss, FaultBroker, FaultPartition, FaultDuplicate, FaultSerialNoise, FaultFirmware}
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
}

// OK reports whether the round found no violation.
func (r *Result) OK() bool { return r.Report.OK() }

// Count returns the number of terminal states v (e.g. "accepted").
func (r *Result) Count(v string) int { return r.Report.Terminal[v] }

// Summary accumulates rounds for the table `make chaos` prints.
type Summary struct {
	Rounds     int
	Failed     int // rounds that could not run to the end (an error, not a violation)
	Faults     map[string]int
	Created    int
	Terminal   map[string]int
	Violations int
	Elapsed    time.Duration
	Errors     []string
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
	for k, n := range res.Faults {
		s.Faults[k] += n
	}
	s.Created += res.Report.Created
	for k, n := range res.Report.Terminal {
		s.Terminal[k] += n
	}
	s.Violations += len(res.Report.Violations)
	s.Elapsed += res.Elapsed
}

// Print writes the summary table.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "rounds           %d (%d could not finish)\n", s.Rounds, s.Failed)
	fmt.Fprintf(w, "elapsed          %v\n", s.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "faults injected\n")
	kinds := make([]string, 0, len(s.Faults))
	for k := range s.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-18s %d\n", k, s.Faults[k])
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
	for i, e := range s.Errors {
		if i == 10 {
			fmt.Fprintf(w, "  ... %d more errors\n", len(s.Errors)-10)
			break
		}
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
