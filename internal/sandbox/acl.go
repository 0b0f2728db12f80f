package sandbox

import (
	"bufio"
	"fmt"
	"strings"
)

// ACL is a Mosquitto acl_file (mosquitto.conf(5), "acl_file"): the rules a
// broker applies to what each user may publish (write) and receive (read).
// The sandbox's mochi broker evaluates the same file format that
// deploy/mosquitto gives Mosquitto, with Mosquitto 2.0's semantics:
//
//   - "topic [read|write|readwrite|deny] TOPIC" lines before any "user"
//     line apply to anonymous clients only; after "user NAME", to that user
//     (a user's lines accumulate across several "user NAME" blocks).
//   - "pattern [read|write|readwrite|deny] TOPIC" lines apply to every
//     authenticated client, with %u replaced by its user name and %c by its
//     client id; a name holding '/', '+' or '#' matches no pattern.
//   - The access defaults to readwrite. A deny rule whose topic matches
//     refuses, before any grant is looked at (Mosquitto puts a user's deny
//     rules first). Nothing matching means refused.
//
// One difference: a SUBSCRIBE to a filter with wildcards is allowed only if
// a read rule covers every topic the filter can match, and no deny rule
// covers them all (Mosquitto 2.0 grants every SUBSCRIBE and checks read on
// each delivered message; the sandbox broker checks both, so a device
// subscribing to <prefix>/dev/+/cmd is refused up front rather than
// receiving nothing, while a subscription a deny rule only cuts into gets
// every message but the denied ones, as from Mosquitto).
type ACL struct {
	anonymous []aclRule
	users     map[string][]aclRule
	patterns  []aclRule
}

type aclAccess uint8

const (
	aclDeny  aclAccess = 0
	aclRead  aclAccess = 1
	aclWrite aclAccess = 2
)

type aclRule struct {
	access aclAccess
	topic  string
}

// ParseACL reads an acl_file. Blank lines and lines starting with # are
// skipped; any other line that is not a user, topic or pattern line with a
// known access and a valid topic is an error naming its line, wrapping
// ErrBadACL.
func ParseACL(text string) (*ACL, error) {
	a := &ACL{users: map[string][]aclRule{}}
	if err := a.add(text); err != nil {
		return nil, err
	}
	return a, nil
}

// add parses text and appends its rules to a.
func (a *ACL) add(text string) error {
	sc := bufio.NewScanner(strings.NewReader(text))
	user, inUser := "", false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: line %d %q: %s", ErrBadACL, n, line, fmt.Sprintf(format, args...))
		}
		kw, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch kw {
		case "user":
			if rest == "" {
				return bad("no user name")
			}
			user, inUser = rest, true
			continue
		case "topic", "pattern":
		default:
			return bad("want user, topic or pattern")
		}
		r := aclRule{access: aclRead | aclWrite, topic: rest}
		if acc, t, ok := strings.Cut(rest, " "); ok {
			switch acc {
			case "read":
				r = aclRule{aclRead, strings.TrimSpace(t)}
			case "write":
				r = aclRule{aclWrite, strings.TrimSpace(t)}
			case "readwrite":
				r = aclRule{aclRead | aclWrite, strings.TrimSpace(t)}
			case "deny":
				r = aclRule{aclDeny, strings.TrimSpace(t)}
			}
		}
		if !validFilter(r.topic) {
			return bad("%q is not a topic filter", r.topic)
		}
		switch {
		case kw == "pattern":
			a.patterns = append(a.patterns, r)
		case inUser:
			a.users[user] = append(a.users[user], r)
		default:
			a.anonymous = append(a.anonymous, r)
		}
	}
	return sc.Err()
}

// Allowed reports whether the client (user "" for anonymous) may publish to
// topic (write) or subscribe to the filter / receive a message on topic
// (read).
func (a *ACL) Allowed(user, clientID, topic string, write bool) bool {
	want := aclRead
	if write {
		want = aclWrite
	}
	rules := a.anonymous
	if user != "" {
		rules = append([]aclRule(nil), a.users[user]...)
		for _, p := range a.patterns {
			if t, ok := substitute(p.topic, user, clientID); ok {
				rules = append(rules, aclRule{p.access, t})
			}
		}
	}
	for _, r := range rules {
		if r.access == aclDeny && filterCovers(r.topic, topic) {
			return false
		}
	}
	for _, r := range rules {
		if r.access&want != 0 && filterCovers(r.topic, topic) {
			return true
		}
	}
	return false
}

// substitute fills a pattern's %u and %c; ok is false when a value would
// change the topic's structure (Mosquitto refuses such names too).
func substitute(pattern, user, clientID string) (string, bool) {
	if strings.Contains(pattern, "%u") && (user == "" || strings.ContainsAny(user, "/+#")) ||
		strings.Contains(pattern, "%c") && (clientID == "" || strings.ContainsAny(clientID, "/+#")) {
		return "", false
	}
	return strings.NewReplacer("%u", user, "%c", clientID).Replace(pattern), true
}

// filterCovers reports whether every topic that filter f (a topic name is a
// filter without wildcards) can match is matched by rule: rule's '+' covers
// any one level, its '#' everything below; a literal level covers only
// itself.
func filterCovers(rule, f string) bool {
	rl, fl := strings.Split(rule, "/"), strings.Split(f, "/")
	for i, r := range rl {
		if r == "#" {
			return true
		}
		if i >= len(fl) || fl[i] == "#" || r != "+" && r != fl[i] {
			return false
		}
	}
	return len(rl) == len(fl)
}

// validFilter reports whether f is an MQTT topic filter: non-empty, '+'
// and '#' only as whole levels, '#' only last.
func validFilter(f string) bool {
	if f == "" || strings.ContainsRune(f, 0) {
		return false
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.ContainsAny(l, "+#") && len(l) > 1 || l == "#" && i != len(levels)-1 {
			return false
		}
	}
	return true
}

// DeviceACL is the rule set of deploy/mosquitto/edgefence.acl for devices
// under prefix: a device authenticates with its device id as its user name
// and may read only its own command topic and write only its own ack and
// state.
func DeviceACL(prefix string) string {
	return fmt.Sprintf("pattern read %[1]s/dev/%%u/cmd\npattern write %[1]s/dev/%%u/ack\npattern write %[1]s/dev/%%u/state\n", prefix)
}

// GatewayACL is a gateway user's block: it may command every device and
// read every ack and state under prefix, and for each device in home (the
// `fence: gateway` devices it bridges) it speaks as the device does: reads
// its command topic and writes its ack and state.
func GatewayACL(prefix, user string, home ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "user %[2]s\ntopic write %[1]s/dev/+/cmd\ntopic read %[1]s/dev/+/ack\ntopic read %[1]s/dev/+/state\n", prefix, user)
	for _, d := range home {
		b.WriteString(deviceTopics(prefix, d))
	}
	return b.String()
}

// FleetACL is the block of a user that serves several devices over one
// connection (edgefence-devsim --devices a,b,c): each device's own topics.
func FleetACL(prefix, user string, devices ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "user %s\n", user)
	for _, d := range devices {
		b.WriteString(deviceTopics(prefix, d))
	}
	return b.String()
}

// ObserverACL is the block of a user that may only watch: read everything
// under prefix (mosquitto_sub -t '<prefix>/#').
func ObserverACL(prefix, user string) string {
	return fmt.Sprintf("user %s\ntopic read %s/#\n", user, prefix)
}

func deviceTopics(prefix, d string) string {
	return fmt.Sprintf("topic read %[1]s/dev/%[2]s/cmd\ntopic write %[1]s/dev/%[2]s/ack\ntopic write %[1]s/dev/%[2]s/state\n", prefix, d)
}
