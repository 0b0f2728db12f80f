package shim_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
)

// epochKillEnv names the database file (and, with ".root", the operator key
// prefix) a re-executed test binary drives until it is killed
// (epochKillMain).
const epochKillEnv = "EDGEFENCE_SHIM_EPOCH_KILL_HELPER"

// epochResetMark is the mark every reset of the epoch kill test sets.
var epochResetMark = fence.Mark{Token: 10, Seq: math.MaxUint64}

// epochKillMain runs in the child: from the epoch after the last reset's,
// reset dev-e into epoch i (counter i), print "reset i"; command it in
// epoch i (token 11), print "ack i"; check that a command of epoch i-1
// with a huge token is stale. For ever, until killed.
func epochKillMain(path string) int {
	k, err := auth.ReadKey(path + ".root.key")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	root, _ := auth.NewRoot([]byte("operator"), k)
	rk, _ := auth.NewRootKey([]byte("operator"), &k.PublicKey)
	s, err := shim.Open(path, &shim.Options{Root: rk})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	last, err := s.LastReset("dev-e")
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := last.Epoch + 1; time.Now().Before(deadline); i++ {
		raw, _ := root.Reset(auth.Reset{Device: "dev-e", Token: epochResetMark.Token, Seq: epochResetMark.Seq, Counter: i, ID: fmt.Sprintf("reset:%d", i), Epoch: i})
		if a := s.Handle("dev-e", raw, counter{}); a.Verdict != fence.Accepted {
			fmt.Printf("bad reset %d %s %s\n", i, a.Verdict, a.Reason)
			return 1
		}
		fmt.Printf("reset %d\n", i)
		cmd, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-e", Token: 11, Seq: 1, ID: fmt.Sprintf("c-%d", i), Kind: "ok", Epoch: i})
		if a := s.Handle("dev-e", cmd, counter{}); a.Verdict != fence.Accepted {
			fmt.Printf("bad ack %d %s %s\n", i, a.Verdict, a.Reason)
			return 1
		}
		fmt.Printf("ack %d\n", i)
		old, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-e", Token: 1 << 40, Seq: 1, ID: "old", Kind: "ok", Epoch: i - 1})
		if a := s.Handle("dev-e", old, counter{}); a.Verdict != fence.Stale {
			fmt.Printf("bad stale %d %s\n", i, a.Verdict)
			return 1
		}
	}
	s.Close()
	return 0
}

// TestEpochKill9 kills a process that resets a device into a new epoch and
// commands it, over and over, at random moments; after each kill the reset
// record, the mark and its epoch are of one commit (never a reset's epoch
// without its mark), no acknowledged reset or command is lost, at most the
// one in flight is ahead, and a command of an earlier epoch is stale.
func TestEpochKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	path := filepath.Join(t.TempDir(), "fence.db")
	k, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.WriteKeyPair(path+".root", k); err != nil {
		t.Fatal(err)
	}
	rk, _ := auth.NewRootKey([]byte("operator"), &k.PublicKey)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	var lastReset, lastAck uint64
	for round := range 8 {
		resets, acks := epochKillRound(t, path, time.Duration(rng.IntN(40_000))*time.Microsecond)
		lastReset, lastAck = max(lastReset, resets), max(lastAck, acks)
		s, err := shim.Open(path, &shim.Options{Root: rk})
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		r, err := s.LastReset("dev-e")
		if err != nil {
			t.Fatal(err)
		}
		rec, err := s.Record("dev-e")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r.Epoch < lastReset || r.Epoch > lastReset+1:
			t.Fatalf("round %d: last reset of epoch %d, %d acknowledged", round, r.Epoch, lastReset)
		case rec.Epoch != r.Epoch || r.Counter != r.Epoch:
			t.Fatalf("round %d: mark %v of epoch %d, last reset %+v: not one commit", round, rec.Mark, rec.Epoch, r)
		case lastAck == r.Epoch && rec.Mark != (fence.Mark{Token: 11, Seq: 1}):
			t.Fatalf("round %d: the acknowledged command of epoch %d lost: mark %v", round, r.Epoch, rec.Mark)
		case rec.Mark != epochResetMark && rec.Mark != (fence.Mark{Token: 11, Seq: 1}):
			t.Fatalf("round %d: mark %v", round, rec.Mark)
		}
		old, _ := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: "dev-e", Token: 1 << 41, Seq: 1, ID: "old", Kind: "ok", Epoch: r.Epoch - 1})
		if a := s.Handle("dev-e", old, counter{}); a.Verdict != fence.Stale {
			t.Fatalf("round %d: a command of epoch %d after the kill: %+v", round, r.Epoch-1, a)
		}
		s.Close()
		lastReset = r.Epoch
		if rec.Mark == (fence.Mark{Token: 11, Seq: 1}) {
			lastAck = r.Epoch
		}
		t.Logf("round %d: %d resets acknowledged, in epoch %d with mark %v", round, resets, r.Epoch, rec.Mark)
	}
}

// epochKillRound runs the helper for d after its first line, kills it
// with SIGKILL and returns the last reset and command it acknowledged.
func epochKillRound(t *testing.T, path string, d time.Duration) (resets, acks uint64) {
	t.Helper()
	runKilled(t, []string{epochKillEnv + "=" + path}, d, func(l string) {
		var what string
		var n uint64
		if _, err := fmt.Sscanf(l, "%s %d", &what, &n); err != nil || l != fmt.Sprintf("%s %d", what, n) {
			t.Errorf("helper said %q", l)
			return
		}
		switch what {
		case "reset":
			resets = n
		case "ack":
			acks = n
		default:
			t.Errorf("helper said %q", l)
		}
	})
	return resets, acks
}
