package bridge

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// TestResetAtTheGateway: a gateway-fenced device of the unsigned era is
// bricked in the table by a forged envelope with token 2^63; the
// operator's reset, published on the device's command topic, sets the
// table's mark back in a new epoch and is acked by its id; the holder's
// writes, in that epoch, reach the device again. The same reset replayed, one for another device, one
// signed by a gateway's key, and any reset at a table without a root are
// refused invalid, the mark unchanged, counted.
func TestResetAtTheGateway(t *testing.T) {
	rk, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	root, _ := auth.NewRoot([]byte("operator"), rk)
	rootKey, err := auth.NewRootKey([]byte("operator"), &rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := r.startBridgeWith(Config{Table: tbl, Root: rootKey})
	requests := 0
	request := func(raw []byte, id string) *fence.Ack {
		t.Helper()
		requests++
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A client id of its own per request: a fresh connection under the
		// last one's id can race the broker's teardown of that session.
		a, err := mqtt.Request(ctx, mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: fmt.Sprintf("operator-%d", requests)}, r.topics, "plc-1", raw, id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	sign := func(signer *auth.Root, dev string, counter uint64, id string) []byte {
		t.Helper()
		raw, err := signer.Reset(auth.Reset{Device: dev, Token: 6, Seq: math.MaxUint64, Counter: counter, ID: id, Epoch: counter})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}

	if a := r.write(7, 1, 100); a.Verdict != fence.Accepted {
		t.Fatalf("holder: %+v", a)
	}
	if a := r.write(1<<63, 1, 666); a.Verdict != fence.Accepted {
		t.Fatalf("the forgery (no Keys): %+v", a)
	}
	if a := r.write(7, 2, 101); a.Verdict != fence.Stale {
		t.Fatalf("bricked: %+v", a)
	}
	good := sign(root, "plc-1", 1, "reset:one")
	a := request(good, "reset:one")
	if a.Verdict != fence.Accepted || a.State() != (fence.State{Epoch: 1, Mark: fence.Mark{Token: 6, Seq: math.MaxUint64}}) || a.Device != "plc-1" {
		t.Fatalf("reset: %+v", a)
	}
	if a := r.write(7, 3, 102); a.Verdict != fence.Stale || a.Epoch != 1 {
		t.Fatalf("the holder's write of epoch 0 after the reset: %+v", a)
	}
	if a := r.writeIn(1, 7, 3, 102); a.Verdict != fence.Accepted {
		t.Fatalf("holder after the reset: %+v", a)
	}
	if v := r.register(); v != 102 {
		t.Fatalf("register %d, want the holder's 102", v)
	}
	after := fence.Mark{Token: 7, Seq: 3}

	gk, _ := auth.NewKey()
	gwRoot, _ := auth.NewRoot([]byte("gw/1"), gk)
	for _, tc := range []struct {
		name, id string
		raw      []byte
		want     error
	}{
		{"replayed", "reset:one", good, auth.ErrReplayedReset},
		{"another device", "reset:other", sign(root, "plc-2", 5, "reset:other"), auth.ErrResetDevice},
		{"a gateway key", "reset:gw", sign(gwRoot, "plc-1", 6, "reset:gw"), auth.ErrUnknownKey},
	} {
		a := request(tc.raw, tc.id)
		if a.Verdict != fence.Invalid || !strings.Contains(a.Reason, tc.want.Error()) || a.Mark() != after {
			t.Errorf("%s: %+v, want invalid (%v), mark %v", tc.name, a, tc.want, after)
		}
	}
	if rec, _, err := tbl.Get("plc-1"); err != nil || rec.Mark != after {
		t.Fatalf("table mark %v %v", rec.Mark, err)
	}
	if st := br.Stats(); st.Resets != 1 || st.ResetsRefused != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// Without a root, the gateway's table refuses every reset.
func TestResetWithoutRoot(t *testing.T) {
	rk, _ := auth.NewKey()
	root, _ := auth.NewRoot([]byte("operator"), rk)
	r := newRig(t)
	tbl, err := fence.OpenTable(filepath.Join(t.TempDir(), "fence.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.startBridgeWith(Config{Table: tbl})
	raw, err := root.Reset(auth.Reset{Device: "plc-1", Token: 6, Seq: 1, Counter: 1, ID: "reset:x", Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := mqtt.Request(ctx, mqtt.Config{Brokers: []string{r.broker.URL()}, ClientID: "operator-x"}, r.topics, "plc-1", raw, "reset:x")
	if err != nil || a.Verdict != fence.Invalid || !strings.Contains(a.Reason, auth.ErrNoRoot.Error()) || a.ID != "reset:x" {
		t.Fatalf("%+v %v", a, err)
	}
}
