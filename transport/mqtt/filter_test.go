package mqtt

import (
	"strings"
	"testing"
)

// matchCases doubles as the fuzz seed corpus.
var matchCases = []struct {
	filter, topic string
	match         bool
}{
	{"a/b", "a/b", true},
	{"a/b", "a/c", false},
	{"a/b", "a/b/c", false},
	{"a/b/c", "a/b", false},
	{"a/+", "a/b", true},
	{"a/+", "a/", true},
	{"a/+", "a", false},
	{"a/+", "a/b/c", false},
	{"+", "a", true},
	{"+", "", true},
	{"+", "a/b", false},
	{"+/+", "/a", true},
	{"+/b/+", "a/b/c", true},
	{"a/#", "a", true},
	{"a/#", "a/b", true},
	{"a/#", "a/b/c", true},
	{"a/#", "ab", false},
	{"a/b/#", "a", false},
	{"#", "a/b/c", true},
	{"#", "/", true},
	{"+/#", "a", true},
	{"#", "$SYS/x", false},
	{"+/x", "$SYS/x", false},
	{"$SYS/#", "$SYS/x", true},
	{"$share/g/a/+", "a/b", true},
	{"$share/g/a/+", "b/b", false},
	{"edgefence/v1/dev/+/cmd", "edgefence/v1/dev/d1/cmd", true},
	{"edgefence/v1/dev/+/cmd", "edgefence/v1/dev/d1/ack", false},
}

func TestMatchFilter(t *testing.T) {
	for _, tc := range matchCases {
		if !validFilter(tc.filter) {
			t.Errorf("validFilter(%q) = false", tc.filter)
		}
		if got := matchFilter(tc.filter, tc.topic); got != tc.match {
			t.Errorf("matchFilter(%q, %q) = %v, want %v", tc.filter, tc.topic, got, tc.match)
		}
	}
}

func TestValidFilter(t *testing.T) {
	for _, f := range []string{"a", "/", "a/b", "+", "#", "+/+", "a/+/b", "a/#", "$share/g/#", "$SYS/#"} {
		if !validFilter(f) {
			t.Errorf("validFilter(%q) = false, want true", f)
		}
	}
	for _, f := range []string{"", "a+", "a/b+", "#/a", "a/#/b", "a#", "+a", "a\x00", "\xff",
		"$share/", "$share/g", "$share//a", "$share/g+/a", strings.Repeat("a", 65536)} {
		if validFilter(f) {
			t.Errorf("validFilter(%q) = true, want false", f)
		}
	}
}

func TestValidTopic(t *testing.T) {
	for _, s := range []string{"a", "/", "a/b", "$SYS/x", " ", "ü"} {
		if !validTopic(s) {
			t.Errorf("validTopic(%q) = false", s)
		}
	}
	for _, s := range []string{"", "+", "a/#", "a+b", "a\x00", "\xff\xfe", strings.Repeat("a", 65536)} {
		if validTopic(s) {
			t.Errorf("validTopic(%q) = true", s)
		}
	}
}

func FuzzMatchFilter(f *testing.F) {
	for _, tc := range matchCases {
		f.Add(tc.filter, tc.topic)
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		if !validFilter(filter) || !validTopic(topic) {
			return
		}
		m := matchFilter(filter, topic) // must not panic
		if filter == topic && !m {
			t.Fatalf("literal filter %q does not match itself", filter)
		}
		if (filter == "#") && !strings.HasPrefix(topic, "$") && !m {
			t.Fatalf("# does not match %q", topic)
		}
	})
}
