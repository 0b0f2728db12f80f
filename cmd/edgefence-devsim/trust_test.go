package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestDevsimTrustOverTheAir: a devsim provisioned with only --trust-root
// and --trust-root-kid (no --certs) refuses a gateway's signed command
// until the gateway's trust update (its certificate) came, then accepts
// it; a newer revocation list makes it refuse that gateway, and another
// gateway whose certificate came in the same update is accepted. Killed
// with SIGKILL and restarted (the root only, as provisioned), it still
// refuses the revoked gateway, still knows the other, and an older list
// replayed changes nothing.
func TestDevsimTrustOverTheAir(t *testing.T) {
	if testing.Short() {
		t.Skip("runs and kills subprocesses")
	}
	op := authtest.NewOperator(t)
	keys := filepath.Join(t.TempDir(), "operator")
	if err := auth.WriteKeyPair(keys, op.Key); err != nil {
		t.Fatal(err)
	}
	gwA, gwB := op.Certify("gw-a", "dev-*"), op.Certify("gw-b", "dev-*")

	url := startBroker(t)
	k := sandbox.NewCommander(t, url, mqtt.Topics{})
	publish := func(payload []byte) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := k.Client.Publish(ctx, mqtt.Message{Topic: k.Topics.Cmd("dev-1"), Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(gw *authtest.Gateway, tok fence.Token, seq uint64) fence.Ack {
		t.Helper()
		body, err := sim.SetBody{Setpoint: ptr(float64(tok))}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("dev-1-%d-%d", tok, seq)
		raw, err := gw.Signer.Sign(&fence.Envelope{V: fence.Version, Device: "dev-1", Token: tok, Seq: seq, ID: id,
			Kind: sim.KindSet, Body: body, Holder: "gw"})
		if err != nil {
			t.Fatal(err)
		}
		publish(raw)
		return k.Await(t, id)
	}
	args := []string{"--mqtt", url, "--devices", "dev-1", "--dir", t.TempDir(), "--log", filepath.Join(t.TempDir(), "v.jsonl"),
		"--trust-root", keys + ".pub", "--trust-root-kid", authtest.RootKID}
	d := startDevsim(t, args...)
	d.awaitReady(t)

	if a := send(gwA, 5, 1); a.Verdict != fence.Invalid {
		t.Fatalf("before the trust update: %+v", a)
	}
	publish(authtest.Update(t, gwA.Cert, op.Revoke(1)))
	if a := send(gwA, 5, 1); a.Verdict != fence.Accepted {
		t.Fatalf("after the trust update: %+v", a)
	}
	publish(authtest.Update(t, gwB.Cert, op.Revoke(2, "gw-a")))
	if a := send(gwA, 5, 2); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "revoked") || a.Mark() != (fence.Mark{Token: 5, Seq: 1}) {
		t.Fatalf("revoked gateway: %+v", a)
	}
	if a := send(gwB, 7, 1); a.Verdict != fence.Accepted {
		t.Fatalf("the other gateway: %+v", a)
	}

	d.cmd.Process.Signal(syscall.SIGKILL)
	d.wait(t)
	d = startDevsim(t, args...)
	d.awaitReady(t)
	publish(authtest.Update(t, op.Revoke(1)))
	if a := send(gwA, 8, 1); a.Verdict != fence.Invalid || !strings.Contains(a.Reason, "revoked") || a.Mark() != (fence.Mark{Token: 7, Seq: 1}) {
		t.Fatalf("revoked gateway after kill -9 and an older list: %+v", a)
	}
	if a := send(gwB, 9, 1); a.Verdict != fence.Accepted {
		t.Fatalf("learned certificate after kill -9: %+v", a)
	}
	d.stop(t, syscall.SIGTERM)
}
