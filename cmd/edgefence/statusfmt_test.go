package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// superseded is the ack the agent makes for a strict device's queued
// command once another session holds the lock (agent/outbox.go).
var superseded = &fence.Ack{V: fence.Version, Device: "pump-7", ID: "c-1", Token: 9, Seq: 3, Verdict: fence.Stale,
	Reason: "superseded: another session holds the lock; never sent"}

// TestUnsentVerdictsShownAsSuch: a command the agent
// ended itself without sending it is not shown as if a fence point had
// answered "at token 0 seq 0", in outbox show, status and devices; the
// devices table counts it in STALE, so ACCEPTED/STALE agrees with LAST
// VERDICT; status shows why a device is refused and token_regressions.
func TestUnsentVerdictsShownAsSuch(t *testing.T) {
	var b bytes.Buffer
	printEntry(&b, &offline.Record{ID: "c-1", Device: "pump-7", Token: 9, Seq: 3, Kind: "set", State: fence.Stale,
		Ack: superseded, Resolved: time.Now()})
	if s := b.String(); strings.Contains(s, "fence point at token 0") ||
		!strings.Contains(s, "ack       - (ended stale by the agent, never sent; token 9 seq 3)") || !strings.Contains(s, "reason    superseded: ") {
		t.Errorf("outbox show of a superseded command:\n%s", s)
	}

	dev := agent.DeviceStatus{ID: "pump-7", State: agent.StateRefused, Token: 0, Policy: "strict", Fence: "device",
		Reason:   "token regression: etcd granted token 5, not above 9 held before (README, token regression)",
		Verdicts: agent.VerdictCounts{Accepted: 2, Superseded: 1}, LastAck: agent.NewAckStatus(superseded)}
	b.Reset()
	printDevices(&b, []agent.DeviceStatus{dev}, time.Now())
	s := b.String()
	for _, want := range []string{"2/1 (superseded 1)", "stale (token 9 seq 3; ended by the agent, never sent: superseded: ", "token regression: etcd granted token 5"} {
		if !strings.Contains(s, want) {
			t.Errorf("devices lacks %q:\n%s", want, s)
		}
	}
	st := &agent.Status{Gateway: "gw-1", Devices: []agent.DeviceStatus{dev}, Counters: agent.Counters{Regressions: 1, Superseded: 1},
		Transport: map[string]any{"connected": false, "reconnects": float64(9), "published": float64(120)}}
	b.Reset()
	printStatus(&b, st)
	s = b.String()
	for _, want := range []string{"never sent: superseded", "refused: token regression: etcd granted token 5", "token_regressions 1",
		"superseded 1", "mqtt     DISCONNECTED, 9 reconnects; published 120 "} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "fence at 0/0") || strings.Contains(s, `{"`) {
		t.Errorf("status shows an unsent command's fence mark, or raw JSON:\n%s", s)
	}
}

// TestMQTTLineOversize: packets the client dropped over max_packet_size,
// and acks that came after their wait ended, show in the mqtt line once
// there are any.
func TestMQTTLineOversize(t *testing.T) {
	quiet := mqttLine(map[string]any{"connected": true, "packets_oversize": float64(0), "acks_late": float64(0)})
	loud := mqttLine(map[string]any{"connected": true, "packets_oversize": float64(2), "acks_late": float64(1)})
	if strings.Contains(quiet, "max_packet_size") || strings.Contains(quiet, "after their wait") ||
		!strings.HasSuffix(loud, "; 1 acks came after their wait ended (kept for the resend); 2 packets over max_packet_size dropped") {
		t.Errorf("mqtt lines:\n%s\n%s", quiet, loud)
	}
}

func TestTrustLine(t *testing.T) {
	until := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		in   agent.TrustStatus
		want string
	}{
		{agent.TrustStatus{KeyID: "gw-1", CertificateOK: true, NotAfter: until, RevocationVersion: 2, Statements: 3},
			"certificate gw-1 valid until 2027-01-02 03:04:05; revocation list 2; 3 statements kept"},
		{agent.TrustStatus{KeyID: "gw-1", CertificateProblem: "auth: signer key revoked: 67772d31 (revocation list 2)", RevocationVersion: 2,
			Statements: 3, Republished: 2, Releases: map[string]uint64{"signer_refused": 1, "own_certificate": 4}},
			"certificate gw-1 NOT VALID: auth: signer key revoked: 67772d31 (revocation list 2); revocation list 2; 3 statements kept; " +
				"2 put back into etcd; left 4 for own_certificate; left 1 for signer_refused"},
		{agent.TrustStatus{CertificateOK: true, Statements: 1}, "no certificate of this gateway's (auth.certificate); revocation list 0; 1 statements kept"},
	} {
		if got := trustLine(&c.in); got != c.want {
			t.Errorf("trustLine(%+v)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}
