package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
)

// The human forms of status parts that `status` and `devices` share.

// lastVerdict describes a device's last ended command. A verdict the
// agent decided itself (expired, superseded) says so: no fence point
// answered it, so there is no fence mark to show. withMark adds the fence
// point's mark of an answered one.
func lastVerdict(a *agent.AckStatus, withMark bool) string {
	switch {
	case a == nil:
		return "-"
	case a.Unsent:
		return fmt.Sprintf("%s (token %d seq %d; ended by the agent, never sent: %s)", a.Verdict, a.Token, a.Seq, oneLine(a.Reason))
	case withMark:
		return fmt.Sprintf("%s (token %d seq %d; fence at %d/%d)", a.Verdict, a.Token, a.Seq, a.MaxToken, a.LastSeq)
	default:
		return fmt.Sprintf("%s (token %d seq %d)", a.Verdict, a.Token, a.Seq)
	}
}

// mqttLine is the transport's status map as one readable line. The map
// comes through JSON, so its numbers are float64; keys it does not know
// are left out of the line (status --json shows them all).
func mqttLine(m map[string]any) string {
	num := func(k string) uint64 {
		switch v := m[k].(type) {
		case float64:
			return uint64(v)
		case uint64:
			return v
		case int:
			return uint64(v)
		}
		return 0
	}
	var b strings.Builder
	switch c, ok := m["connected"].(bool); {
	case !ok:
		b.WriteString("state unknown")
	case c && m["broker"] != nil && m["broker"] != "":
		fmt.Fprintf(&b, "connected to %v", m["broker"])
	case c:
		b.WriteString("connected")
	default:
		b.WriteString("DISCONNECTED")
	}
	fmt.Fprintf(&b, ", %d reconnects; published %d (%d errors), %d in flight, %d resends; acks %d (%d unmatched, %d malformed)",
		num("reconnects"), num("published"), num("publish_errors"), num("in_flight"), num("resends"),
		num("acks"), num("acks_unmatched"), num("acks_malformed"))
	if n := num("acks_late"); n > 0 {
		fmt.Fprintf(&b, "; %d acks came after their wait ended (kept for the resend)", n)
	}
	if n := num("unsigned"); n > 0 {
		fmt.Fprintf(&b, "; %d sends unsigned", n)
	}
	if n := num("packets_oversize"); n > 0 {
		fmt.Fprintf(&b, "; %d packets over max_packet_size dropped", n)
	}
	return b.String()
}

// printTail writes the lease-tail summary: what threatens the lease,
// measured, against lease_ttl, and the warning when it is on.
func printTail(w io.Writer, t agent.TailStatus) {
	sec := func(s float64) string { return fmtSeconds(s) }
	fmt.Fprintf(w, "tail     last %s: max stall %s, keep-alive p99 %s (max %s, %d probes)", shortDur(t.Window),
		sec(t.Stall.Max), sec(t.KeepAlive.P99), sec(t.KeepAlive.Max), t.KeepAlive.Samples)
	if f := t.Fsync; f != nil {
		fmt.Fprintf(w, ", fsync p99 %s (max %s, %d commits)", sec(f.P99), sec(f.Max), f.Samples)
	}
	fmt.Fprintf(w, "; lease_ttl %s: margin %s\n", sec(t.TTL), sec(t.Margin))
	if t.Warning != "" {
		fmt.Fprintf(w, "WARNING  %s\n", t.Warning)
	}
}

// fmtSeconds prints seconds as ms below one second, else as seconds.
func fmtSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < 0:
		return "-" + fmtSeconds(-s)
	case d < time.Millisecond:
		return fmt.Sprintf("%.2f ms", s*1000)
	case d < time.Second:
		return fmt.Sprintf("%.0f ms", s*1000)
	default:
		return fmt.Sprintf("%.1f s", s)
	}
}

// shortDur drops the zero tail of a Duration's string ("5m0s" → "5m").
func shortDur(s string) string {
	if d, err := time.ParseDuration(s); err == nil && d%time.Minute == 0 && d > 0 {
		return strings.TrimSuffix(d.String(), "0s")
	}
	return s
}

// holderText says who holds a device's lock while another session does:
// the gateway id on its lock key, or, for a key without one, that it is
// not a gateway (`etcdctl lock` on the device's lock prefix: maintenance).
func holderText(h *agent.HolderStatus, now time.Time) string {
	who := "gateway " + h.Gateway
	if h.Gateway == "" {
		who = "a session that names no gateway (etcdctl lock: maintenance?)"
	}
	return fmt.Sprintf("lock held by %s, token %d, seen holding for %s", who, h.Token, fmtAge(now.Sub(h.Since)))
}

// reasonCell is the devices table's REASON: why the device is in its
// state, and who holds its lock while another session does.
func reasonCell(d agent.DeviceStatus, now time.Time) string {
	parts := []string{}
	if d.Reason != "" {
		parts = append(parts, oneLine(d.Reason))
	}
	if d.Holder != nil {
		parts = append(parts, holderText(d.Holder, now))
	}
	return strings.Join(parts, "; ")
}

// trustLine is the agent's trust in one line: this gateway's certificate
// (and what is wrong with it), the revocation list, what it keeps, and the
// devices it left because it cannot command them with trust.
func trustLine(t *agent.TrustStatus) string {
	var parts []string
	switch {
	case t.KeyID == "":
		parts = append(parts, "no certificate of this gateway's (auth.certificate)")
	case !t.CertificateOK:
		parts = append(parts, fmt.Sprintf("certificate %s NOT VALID: %s", t.KeyID, oneLine(t.CertificateProblem)))
	default:
		parts = append(parts, fmt.Sprintf("certificate %s valid until %s", t.KeyID, t.NotAfter.Format(time.DateTime)))
	}
	parts = append(parts, fmt.Sprintf("revocation list %d", t.RevocationVersion), fmt.Sprintf("%d statements kept", t.Statements))
	if t.Republished > 0 {
		parts = append(parts, fmt.Sprintf("%d put back into etcd", t.Republished))
	}
	for _, r := range slices.Sorted(maps.Keys(t.Releases)) {
		parts = append(parts, fmt.Sprintf("left %d for %s", t.Releases[r], r))
	}
	return strings.Join(parts, "; ")
}

// authLine is the devices' signing policy in one line: how many get signed
// commands (`auth: required`) and which are `auth: off` (plain envelopes,
// which a broker client can forge), the first few by name.
func authLine(devs []agent.DeviceStatus) string {
	var off []string
	for _, d := range devs {
		if d.Auth == agent.AuthOff {
			off = append(off, d.ID)
		}
	}
	s := fmt.Sprintf("%d of %d devices auth: required (signed commands)", len(devs)-len(off), len(devs))
	if len(off) == 0 {
		return s
	}
	const show = 5
	names := strings.Join(off[:min(len(off), show)], ", ")
	if len(off) > show {
		names += fmt.Sprintf(" and %d more", len(off)-show)
	}
	return s + fmt.Sprintf("; OFF for %s: plain envelopes, forgeable by any broker client", names)
}
