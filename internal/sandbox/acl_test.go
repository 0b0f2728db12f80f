package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deployACL is deploy/mosquitto/edgefence.acl, the file an operator
// installs for Mosquitto.
func deployACL(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "mosquitto", "edgefence.acl"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// aclCase is one question to an ACL and its answer under deploy's file.
type aclCase struct {
	user, topic string
	write, want bool
}

// deployACLCases are the flows of edgefence (and the attacks on them) that
// deploy/mosquitto/edgefence.acl decides: gw-a and gw-b are gateways, gw-b
// the home of plc-1; thermostat-1 and -2 are devices; operator reads.
var deployACLCases = []aclCase{
	// Devices: their own cmd (read), ack and state (write), nothing else.
	{"thermostat-1", "edgefence/v1/dev/thermostat-1/cmd", false, true},
	{"thermostat-1", "edgefence/v1/dev/thermostat-1/ack", true, true},
	{"thermostat-1", "edgefence/v1/dev/thermostat-1/state", true, true},
	{"thermostat-1", "edgefence/v1/dev/thermostat-1/cmd", true, false},   // command itself
	{"thermostat-1", "edgefence/v1/dev/thermostat-2/cmd", true, false},   // command another device
	{"thermostat-1", "edgefence/v1/dev/thermostat-2/ack", true, false},   // forge another device's ack
	{"thermostat-1", "edgefence/v1/dev/thermostat-2/state", true, false}, // forge its state
	{"thermostat-1", "edgefence/v1/dev/thermostat-2/cmd", false, false},  // read its commands
	{"thermostat-1", "edgefence/v1/dev/thermostat-2/ack", false, false},
	{"thermostat-1", "edgefence/v1/dev/+/cmd", false, false},
	{"thermostat-1", "edgefence/v1/dev/plc-1/ack", true, false},
	{"thermostat-1", "other/topic", true, false},
	// Gateways: every cmd (write), every ack and state (read).
	{"gw-a", "edgefence/v1/dev/thermostat-2/cmd", true, true},
	{"gw-a", "edgefence/v1/dev/+/state", false, true},
	{"gw-a", "edgefence/v1/dev/thermostat-2/ack", false, true},
	{"gw-a", "edgefence/v1/dev/thermostat-2/ack", true, false}, // a gateway forging a device's ack
	{"gw-a", "edgefence/v1/dev/thermostat-2/cmd", false, false},
	{"gw-a", "edgefence/v1/dev/plc-1/cmd", false, false}, // not plc-1's home
	{"gw-a", "edgefence/v1/dev/plc-1/ack", true, false},
	{"gw-a", "edgefence/v1/dev/#", false, false},
	// The home gateway speaks for its bridged device, and only for it.
	{"gw-b", "edgefence/v1/dev/plc-1/cmd", false, true},
	{"gw-b", "edgefence/v1/dev/plc-1/ack", true, true},
	{"gw-b", "edgefence/v1/dev/plc-1/state", true, true},
	{"gw-b", "edgefence/v1/dev/thermostat-2/ack", true, false},
	// The read-only operator: every topic under the prefix, no publish at
	// all (not even the device topics the patterns give every user).
	{"operator", "edgefence/v1/#", false, true},
	{"operator", "edgefence/v1/dev/thermostat-1/cmd", false, true},
	{"operator", "edgefence/v1/dev/thermostat-1/ack", false, true},
	{"operator", "edgefence/v1/dev/thermostat-1/state", false, true},
	{"operator", "edgefence/v1/dev/thermostat-1/cmd", true, false},
	{"operator", "edgefence/v1/dev/thermostat-1/ack", true, false},
	{"operator", "edgefence/v1/dev/plc-1/state", true, false},
	{"operator", "edgefence/v1/dev/operator/ack", true, false},
	{"operator", "edgefence/v1/dev/operator/state", true, false},
	{"operator", "other/topic", false, false},
	// Anonymous: nothing.
	{"", "edgefence/v1/dev/thermostat-1/cmd", false, false},
	{"", "edgefence/v1/dev/thermostat-1/ack", true, false},
}

func TestDeployACL(t *testing.T) {
	acl, err := ParseACL(deployACL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range deployACLCases {
		if got := acl.Allowed(c.user, "client-"+c.user, c.topic, c.write); got != c.want {
			t.Errorf("user %q write=%v %s: allowed=%v, want %v", c.user, c.write, c.topic, got, c.want)
		}
	}
}

// TestDeployACLMatchesSandbox: the rules the sandbox gives its broker are
// deploy's, line for line.
func TestDeployACLMatchesSandbox(t *testing.T) {
	file := deployACL(t)
	for _, block := range []string{DeviceACL("edgefence/v1"), GatewayACL("edgefence/v1", "gw-b"),
		strings.TrimPrefix(GatewayACL("edgefence/v1", "gw-b", "plc-1"), GatewayACL("edgefence/v1", "gw-b"))} {
		if !strings.Contains(file, block) {
			t.Errorf("deploy/mosquitto/edgefence.acl lacks the sandbox's rules:\n%s", block)
		}
	}
}

func TestACLSemantics(t *testing.T) {
	acl, err := ParseACL(`# anonymous
topic read public/#
user alice
topic a/#
topic deny a/secret
user bob
topic write b/+/x
user alice
topic read more/x
pattern read p/%u/%c
pattern write q/%c
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, client, topic string
		write, want         bool
	}{
		{"", "", "public/news", false, true},
		{"alice", "c", "public/news", false, false}, // anonymous rules are for anonymous clients
		{"alice", "c", "a/b/c", true, true},         // readwrite by default
		{"alice", "c", "a/b/c", false, true},
		{"alice", "c", "a/secret", false, false}, // deny first
		{"alice", "c", "a/#", false, true},       // a subscription: its a/secret messages are refused one by one
		{"alice", "c", "a/secret", true, false},
		{"alice", "c", "a/+", false, true},
		{"alice", "c", "more/x", false, true}, // a second block adds
		{"bob", "c", "b/1/x", true, true},
		{"bob", "c", "b/1/x", false, false},
		{"bob", "c", "b/1/x/y", true, false},
		{"bob", "c", "b/1", true, false},
		{"bob", "cl", "p/bob/cl", false, true},
		{"bob", "cl", "p/bob/other", false, false},
		{"bob", "cl", "p/+/cl", false, false},
		{"bob", "x/y", "q/x/y", true, false}, // a client id with '/' fills no pattern
		{"b+", "c", "p/b+/c", false, false},
		{"carol", "c", "q/c", true, true}, // patterns apply to every user
	} {
		if got := acl.Allowed(c.user, c.client, c.topic, c.write); got != c.want {
			t.Errorf("%q/%q write=%v %s: %v, want %v", c.user, c.client, c.write, c.topic, got, c.want)
		}
	}
}

func TestACLParseErrors(t *testing.T) {
	for _, text := range []string{
		"user\n",
		"topic read a/#/b\n",
		"pattern write a+/b\n",
		"topic\n",
		"allow all\n",
	} {
		_, err := ParseACL(text)
		if !errors.Is(err, ErrBadACL) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("ParseACL(%q) = %v, want ErrBadACL naming line 1", text, err)
		}
	}
}

func TestFilterCovers(t *testing.T) {
	for _, c := range []struct {
		rule, f string
		covers  bool
	}{
		{"a/+/c", "a/b/c", true},
		{"a/+/c", "a/+/c", true},
		{"a/b/c", "a/+/c", false},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"a/b", "a/#", false},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"#", "x/y", true},
		{"a/b", "a/c", false},
	} {
		if got := filterCovers(c.rule, c.f); got != c.covers {
			t.Errorf("filterCovers(%q, %q) = %v", c.rule, c.f, got)
		}
	}
}
