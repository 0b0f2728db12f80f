package mqtt

import (
	"strings"
	"testing"
)

func TestTopicsBuild(t *testing.T) {
	for _, tc := range []struct {
		prefix                          string
		cmd, ack, state, allCmd, allAck string
	}{
		{"", "edgefence/v1/dev/d1/cmd", "edgefence/v1/dev/d1/ack", "edgefence/v1/dev/d1/state", "edgefence/v1/dev/+/cmd", "edgefence/v1/dev/+/ack"},
		{"site/a", "site/a/dev/d1/cmd", "site/a/dev/d1/ack", "site/a/dev/d1/state", "site/a/dev/+/cmd", "site/a/dev/+/ack"},
		{"site/a/", "site/a/dev/d1/cmd", "site/a/dev/d1/ack", "site/a/dev/d1/state", "site/a/dev/+/cmd", "site/a/dev/+/ack"},
	} {
		tp := Topics{Prefix: tc.prefix}
		for _, got := range []struct{ got, want string }{
			{tp.Cmd("d1"), tc.cmd}, {tp.Ack("d1"), tc.ack}, {tp.State("d1"), tc.state},
			{tp.AllCmd(), tc.allCmd}, {tp.AllAck(), tc.allAck},
		} {
			if got.got != got.want {
				t.Errorf("prefix %q: got %q, want %q", tc.prefix, got.got, got.want)
			}
		}
		if !matchFilter(tp.AllCmd(), tp.Cmd("d1")) || matchFilter(tp.AllCmd(), tp.Ack("d1")) {
			t.Errorf("prefix %q: AllCmd does not select exactly the cmd topics", tc.prefix)
		}
	}
}

// parseCases doubles as the fuzz seed corpus.
var parseCases = []struct {
	prefix, topic string
	device, leaf  string
	ok            bool
}{
	{"", "edgefence/v1/dev/d1/cmd", "d1", LeafCmd, true},
	{"", "edgefence/v1/dev/d1/ack", "d1", LeafAck, true},
	{"", "edgefence/v1/dev/pump-7.a/state", "pump-7.a", LeafState, true},
	{"", "edgefence/v1/dev/ü/cmd", "ü", LeafCmd, true},
	{"x/y", "x/y/dev/d1/cmd", "d1", LeafCmd, true},
	{"x/y/", "x/y/dev/d1/cmd", "d1", LeafCmd, true},
	{"", "edgefence/v1/dev/+/cmd", "", "", false},  // a filter, not a topic
	{"", "edgefence/v1/dev/#", "", "", false},      // a filter
	{"", "edgefence/v1/dev/d#/cmd", "", "", false}, // wildcard inside the ID
	{"", "edgefence/v1/dev//cmd", "", "", false},   // empty device
	{"", "edgefence/v1/dev/d1/telemetry", "", "", false},
	{"", "edgefence/v1/dev/d1/cmd/extra", "", "", false},
	{"", "edgefence/v1/dev/d1/", "", "", false},
	{"", "edgefence/v1/dev/d1", "", "", false},
	{"", "edgefence/v1/dev/", "", "", false},
	{"", "edgefence/v1/dev", "", "", false},
	{"", "edgefence/v2/dev/d1/cmd", "", "", false},
	{"", "other/edgefence/v1/dev/d1/cmd", "", "", false},
	{"", "edgefence/v1dev/d1/cmd", "", "", false},
	{"", "edgefence/v1/dev/a\x00b/cmd", "", "", false},
	{"", "edgefence/v1/dev/\xff/cmd", "", "", false},
	{"", "", "", "", false},
	{"", "/", "", "", false},
	{"x", "edgefence/v1/dev/d1/cmd", "", "", false},
}

func TestTopicsParse(t *testing.T) {
	for _, tc := range parseCases {
		d, l, ok := Topics{Prefix: tc.prefix}.Parse(tc.topic)
		if d != tc.device || l != tc.leaf || ok != tc.ok {
			t.Errorf("Parse(%q) with prefix %q = %q, %q, %v; want %q, %q, %v",
				tc.topic, tc.prefix, d, l, ok, tc.device, tc.leaf, tc.ok)
		}
	}
}

func FuzzTopicsParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(tc.prefix, tc.topic)
	}
	f.Fuzz(func(t *testing.T, prefix, topic string) {
		tp := Topics{Prefix: prefix}
		device, leaf, ok := tp.Parse(topic)
		if !ok {
			if device != "" || leaf != "" {
				t.Fatalf("Parse(%q) = %q, %q, false: want empty results", topic, device, leaf)
			}
			return
		}
		if !ValidDeviceID(device) {
			t.Fatalf("Parse(%q) accepted invalid device %q", topic, device)
		}
		var rebuilt string
		switch leaf {
		case LeafCmd:
			rebuilt = tp.Cmd(device)
		case LeafAck:
			rebuilt = tp.Ack(device)
		case LeafState:
			rebuilt = tp.State(device)
		default:
			t.Fatalf("Parse(%q) returned unknown leaf %q", topic, leaf)
		}
		if rebuilt != topic {
			t.Fatalf("Parse(%q) = %q, %q but the builder gives %q", topic, device, leaf, rebuilt)
		}
		if strings.ContainsAny(prefix, "+#") {
			return
		}
		if filter := tp.topic("+", leaf); !matchFilter(filter, topic) {
			t.Fatalf("filter %q does not match %q", filter, topic)
		}
	})
}

func TestTopicsRoundTrip(t *testing.T) {
	tp := Topics{}
	for _, id := range []string{"d1", "a.b-c_d", "ü", strings.Repeat("x", 300)} {
		for _, topic := range []string{tp.Cmd(id), tp.Ack(id), tp.State(id)} {
			d, _, ok := tp.Parse(topic)
			if !ok || d != id {
				t.Errorf("Parse(%q) = %q, %v", topic, d, ok)
			}
		}
	}
}
