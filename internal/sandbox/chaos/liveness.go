package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/internal/backoff"
	"github.com/edgefence/edgefence/transport/modbus"
)

// checkLiveness checks L1 (InvariantLiveness) once the load has stopped:
// until LivenessBound after the end of the faults, it probes every device
// not yet settled — held by a gateway that can command it, and a command
// sent through that gateway accepted. Each device left unsettled is a
// violation saying what was last seen. Result.Settled is when the last one
// settled.
func (r *round) checkLiveness(ctx context.Context) []history.Violation {
	end := r.res.FaultEnd
	if end.IsZero() {
		end = time.Now()
	}
	deadline := end.Add(LivenessBound)
	why := map[string]string{}
	for _, d := range append(slices.Clone(r.shimDevs), r.serialDevs...) {
		why[d] = "not probed"
	}
	for n := 0; len(why) > 0; n++ {
		for _, dev := range sortedDevices(why) {
			ok, w := r.probe(ctx, dev, n)
			if ok {
				delete(why, dev)
				r.res.Settled = max(r.res.Settled, time.Since(end))
				continue
			}
			why[dev] = w
		}
		if len(why) == 0 || time.Now().After(deadline) || !backoff.Sleep(ctx, 250*time.Millisecond) {
			break
		}
	}
	var out []history.Violation
	for _, dev := range sortedDevices(why) {
		out = append(out, history.Violation{Invariant: InvariantLiveness, Device: dev,
			Detail: fmt.Sprintf("not held by a gateway that can command it with a command accepted within %v of the end of the faults: %s",
				LivenessBound, why[dev])})
	}
	if len(why) == 0 {
		r.logf("every device held by a gateway that can command it, a command accepted, %v after the faults ended", r.res.Settled.Round(time.Millisecond))
	}
	return out
}

func sortedDevices(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for d := range m {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// probe finds dev's holder and, if it can command dev, sends it one
// command (the n-th probe); ok when that command was accepted, else why
// not.
func (r *round) probe(ctx context.Context, dev string, n int) (ok bool, why string) {
	holder, why := r.capableHolder(ctx, dev)
	if holder == nil {
		return false, why
	}
	kind, body := "set", json.RawMessage(fmt.Sprintf(`{"setpoint": %d}`, 20+n%50))
	if slices.Contains(r.serialDevs, dev) {
		kind, body = modbus.KindWriteRegister, json.RawMessage(fmt.Sprintf(`{"addr": 0, "value": %d}`, 40000+n%1000))
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	res, err := holder.api.Send(sctx, dev, kind, body)
	cancel()
	switch {
	case res != nil && res.Verdict == "accepted":
		return true, ""
	case res != nil:
		return false, fmt.Sprintf("held by %s, a command ended %q %s", holder.name, res.Verdict, res.Error)
	default:
		return false, fmt.Sprintf("held by %s, a command failed: %v", holder.name, err)
	}
}

// capableHolder returns the agent holding dev if it can command it: by
// the operator's records (roundTrust.canCommand) and by its own status
// (its certificate OK). Otherwise nil and why.
func (r *round) capableHolder(ctx context.Context, dev string) (*agentProc, string) {
	why := "held by no gateway"
	for _, a := range r.agents {
		st, err := r.status(ctx, a)
		if err != nil {
			continue
		}
		for _, d := range st.Devices {
			if d.ID != dev || d.State != agent.StateHolding {
				continue
			}
			if r.trust == nil {
				return a, ""
			}
			switch {
			case st.Trust == nil:
				why = fmt.Sprintf("held by %s, which reports no trust", a.name)
			case !st.Trust.CertificateOK:
				why = fmt.Sprintf("held by %s, whose certificate is not OK: %s", a.name, st.Trust.CertificateProblem)
			case !r.trust.canCommand(st.Trust.KeyID, dev):
				why = fmt.Sprintf("held by %s with key %s, which the operator did not certify for it or revoked", a.name, st.Trust.KeyID)
			default:
				return a, ""
			}
		}
	}
	return nil, why
}

// checkTrustDelivered checks L2 (InvariantTrustDelivered) on the round's
// history: no command of a gateway whose key the operator never revoked
// ended invalid for an auth reason.
func (r *round) checkTrustDelivered() []history.Violation {
	if r.trust == nil {
		return nil
	}
	r.trust.mu.Lock()
	exempt := map[string]bool{}
	for _, kid := range r.trust.revoked {
		gw, _, _ := strings.Cut(kid, "/")
		exempt["outbox:"+gw], exempt["outbox-file:"+gw] = true, true
	}
	r.trust.mu.Unlock()
	var out []history.Violation
	for _, e := range r.res.Events {
		if e.Op != history.OpTerminal || e.Verdict != "invalid" || exempt[e.Source] || !authReason(e.Reason) {
			continue
		}
		out = append(out, history.Violation{Invariant: InvariantTrustDelivered, Device: e.Device, ID: e.ID,
			Detail: fmt.Sprintf("a command of %s, whose key was never revoked, ended invalid for want of trust: %s", e.Source, e.Reason)})
	}
	return out
}

// authReason reports whether a refusal's reason is fence/auth's (the Go
// fence points and the C library spell them alike).
func authReason(reason string) bool {
	return strings.Contains(reason, "auth: ") || strings.Contains(reason, "unknown signer key")
}
