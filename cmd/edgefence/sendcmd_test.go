package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestSendVerdictsAndBodies, on a running agent and real devices: send
// prints a line for people by default and JSON with --json; a
// duplicate (the device had already applied this very command) exits 0
// like accepted, not 3; a body CBOR cannot carry as written is refused
// before a seq is used; a field the device does not have is named.
func TestSendVerdictsAndBodies(t *testing.T) {
	e := newEnv(t, "dev-1", "dev-2")
	cfg, sock := e.config("gw-1", 10*time.Second)
	p := e.startAgent("gw-1", cfg)
	st := e.waitHolding(p, sock)
	tok := st.Devices[0].Token

	t.Run("a line for people, JSON with --json", func(t *testing.T) {
		r := edgefence(t, "send", "--socket", sock, "dev-1", "set", `{"setpoint":22}`)
		want := regexp.MustCompile(fmt.Sprintf(`^accepted dev-1 token %d seq 1 id \S+\n$`, tok))
		if r.code != 0 || !want.MatchString(r.stdout) || r.stderr != "" {
			t.Fatalf("want exit 0 and a line matching %s\n%s", want, r)
		}
		r = edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":23}`)
		if res := sendResult(t, r); r.code != 0 || res.Verdict != "accepted" || res.Seq != 2 || !strings.HasPrefix(r.stdout, "{\n  \"device\": \"dev-1\"") {
			t.Fatalf("send --json: %+v, want accepted seq 2, indented as the other --json outputs\n%s", res, r)
		}
	})

	// Another sender applies (token, seq 3) and (token, seq 4) at dev-1
	// under the agent's own token, as the agent's own resend after a lost
	// ack would have: the agent's next commands, seq 3 and 4, are
	// duplicates — already applied, not applied again.
	other := e.commander("gw-1-resend", "dev-1")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	applyFirst := func(seq uint64, setpoint float64) {
		t.Helper()
		body, err := fence.EncodeBody(map[string]any{"setpoint": setpoint})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := other.Send(ctx, &fence.Envelope{V: fence.Version, Device: "dev-1", Token: tok, Seq: seq,
			ID: fmt.Sprintf("resent-%d", seq), Kind: "set", Body: body, Holder: "gw-1"})
		if err != nil || ack.Verdict != fence.Accepted {
			t.Fatalf("seq %d first: %+v, %v", seq, ack, err)
		}
	}

	t.Run("duplicate exits 0", func(t *testing.T) {
		applyFirst(3, 30)
		r := edgefence(t, "send", "--socket", sock, "dev-1", "set", `{"setpoint":31}`)
		if r.code != 0 || !strings.HasPrefix(r.stdout, fmt.Sprintf("duplicate dev-1 token %d seq 3 id ", tok)) ||
			!strings.Contains(r.stdout, "already applied") {
			t.Fatalf("want exit 0 and a duplicate line saying it was already applied\n%s", r)
		}
		applyFirst(4, 40)
		r = edgefence(t, "send", "--json", "--socket", sock, "dev-1", "set", `{"setpoint":41}`)
		if res := sendResult(t, r); r.code != 0 || res.Verdict != "duplicate" || res.Seq != 4 {
			t.Fatalf("send --json: %+v, want duplicate seq 4 and exit 0\n%s", res, r)
		}
		if s, err := e.fleet.State("dev-1"); err != nil || s.Setpoint != 40 {
			t.Fatalf("device state %+v, %v: want setpoint 40, the duplicates not applied", s, err)
		}
	})

	seq := func() uint64 {
		t.Helper()
		st, r := status(t, sock)
		if st == nil {
			t.Fatalf("status\n%s", r)
		}
		return st.Devices[1].Seq
	}
	t.Run("bodies CBOR cannot carry are refused before a seq is used", func(t *testing.T) {
		before := seq()
		for _, tc := range []struct{ body, want string }{
			{`{"setpoint": 1e999}`, `"setpoint": 1e999 is beyond a 64-bit float (it would be sent as +Inf)`},
			{`{"setpoint": 22, "n": 18446744073709551616}`, `"n": integer 18446744073709551616 does not fit in 64 bits`},
		} {
			r := edgefence(t, "send", "--socket", sock, "dev-2", "set", tc.body)
			if r.code != 1 || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
				t.Errorf("want exit 1 and %q on stderr\n%s", tc.want, r)
			}
		}
		if after := seq(); after != before {
			t.Fatalf("dev-2 seq %d → %d: a refused body used up a seq", before, after)
		}
	})

	t.Run("a field the device does not have is named", func(t *testing.T) {
		r := edgefence(t, "send", "--json", "--socket", sock, "dev-2", "set", `{"setpoint": 22, "foo": 1}`)
		res := sendResult(t, r)
		if r.code != 3 || res.Verdict != "invalid" || res.Ack == nil || !strings.Contains(res.Ack.Reason, `unknown field "foo"`) {
			t.Fatalf("%+v, want invalid naming the field, exit 3\n%s", res, r)
		}
		r = edgefence(t, "send", "--socket", sock, "dev-2", "set", `{"bar": 1}`)
		if r.code != 3 || !strings.HasPrefix(r.stdout, "invalid dev-2 token ") || !strings.Contains(r.stdout, `reason: `) ||
			!strings.Contains(r.stdout, `unknown field "bar"`) {
			t.Fatalf("want exit 3 and an invalid line with the reason\n%s", r)
		}
	})

	t.Run("help", func(t *testing.T) {
		r := edgefence(t, "help", "send")
		for _, s := range []string{"duplicate", "-json", "print the agent's answer as JSON"} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("send's help lacks %q\n%s", s, r)
			}
		}
		if strings.Contains(r.stdout, "only format") || strings.Contains(r.stdout, "(default true)") {
			t.Errorf("send's help still describes --json as the only format\n%s", r)
		}
	})
}

// commander returns an MQTT commander of devs, besides the agents (a
// resend, another holder), subscribed, closed when the test ends.
func (e *env) commander(clientID string, devs ...string) *mqtt.Commander {
	t := e.t
	t.Helper()
	c, err := mqtt.NewCommander(t.Context(), mqtt.Config{Brokers: []string{e.world.Broker.URL()}, ClientID: clientID,
		CleanStart: true, SessionExpiry: -1}, e.fleet.Topics(), devs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.Client().AwaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}
