package mqtt

import (
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is the topic prefix used when Topics.Prefix is empty.
const DefaultPrefix = "edgefence/v1"

// Leaves of the per-device topics.
const (
	LeafCmd   = "cmd"   // agent → device: fenced commands
	LeafAck   = "ack"   // device → agent: acknowledgements
	LeafState = "state" // device → agent: reported state
)

// Topics names the MQTT topics under a prefix (default DefaultPrefix):
//
//	<prefix>/dev/<device>/cmd
//	<prefix>/dev/<device>/ack
//	<prefix>/dev/<device>/state
//
// A device ID is one topic level: non-empty UTF-8 without '/', '+', '#' or
// NUL (see ValidDeviceID). The builders do not check it; Parse does.
type Topics struct{ Prefix string }

// Cmd returns <prefix>/dev/<device>/cmd.
func (t Topics) Cmd(device string) string { return t.topic(device, LeafCmd) }

// Ack returns <prefix>/dev/<device>/ack.
func (t Topics) Ack(device string) string { return t.topic(device, LeafAck) }

// State returns <prefix>/dev/<device>/state.
func (t Topics) State(device string) string { return t.topic(device, LeafState) }

// AllCmd returns the filter <prefix>/dev/+/cmd.
func (t Topics) AllCmd() string { return t.topic("+", LeafCmd) }

// AllAck returns the filter <prefix>/dev/+/ack.
func (t Topics) AllAck() string { return t.topic("+", LeafAck) }

// Parse is the inverse of Cmd, Ack and State: it returns the device ID and
// the leaf (LeafCmd, LeafAck or LeafState). ok is false for any other topic:
// another prefix, an unknown leaf, extra levels, an invalid device ID, or a
// filter with wildcards.
func (t Topics) Parse(topic string) (device, leaf string, ok bool) {
	rest, found := strings.CutPrefix(topic, t.prefix()+"/dev/")
	if !found {
		return "", "", false
	}
	device, leaf, found = strings.Cut(rest, "/")
	if !found || !ValidDeviceID(device) {
		return "", "", false
	}
	switch leaf {
	case LeafCmd, LeafAck, LeafState:
		return device, leaf, true
	}
	return "", "", false
}

// ValidDeviceID reports whether id can be used as the device level of a
// topic: non-empty, valid UTF-8, and free of '/', '+', '#' and NUL.
func ValidDeviceID(id string) bool {
	return id != "" && len(id) <= maxStringLen && utf8.ValidString(id) &&
		!strings.ContainsAny(id, "/+#\x00")
}

func (t Topics) topic(device, leaf string) string {
	return t.prefix() + "/dev/" + device + "/" + leaf
}

// prefix returns the prefix without trailing slashes, or DefaultPrefix.
func (t Topics) prefix() string {
	p := strings.TrimRight(t.Prefix, "/")
	if p == "" {
		return DefaultPrefix
	}
	return p
}
