package history_test

import (
	"testing"

	"github.com/edgefence/edgefence/fence/history"
)

// signed is a fence point's verdict on a command signed by kid.
func signed(i int, src, id string, tok, seq uint64, verdict, kid string) history.Event {
	e := ev(i, src, history.OpVerdict, "dev-1", id, tok, seq, verdict)
	e.Signer = kid
	return e
}

// list is a fence point's OpTrust: a revocation list naming kids.
func list(i int, src string, kids ...string) history.Event {
	e := ev(i, src, history.OpTrust, "dev-2", "", 0, 0, "")
	e.Revoked, e.Reason = kids, "revocation list version 1"
	return e
}

// TestCheckRevocation: T1 flags an accept of a revoked signer after its
// fence point recorded the list — for every device of that fence point,
// whatever the token — and nothing else: an accept before the list, a
// refusal after it, another signer, another fence point, an accept
// discarded as uncommitted.
func TestCheckRevocation(t *testing.T) {
	ok := []history.Event{
		signed(1, "shim", "a1", 10, 1, "accepted", "gw-a/1"),
		list(2, "shim", "gw-a/1"),
		signed(3, "shim", "a2", 10, 2, "invalid", "gw-a/1"),
		signed(4, "shim", "b1", 12, 1, "accepted", "gw-b/1"),
		signed(5, "other", "x1", 20, 1, "accepted", "gw-a/1"),   // another fence point, no list there
		signed(6, "shim", "u1", 99, 1, "accepted", "gw-a/1"),    // never committed:
		ev(7, "shim", history.OpOpened, "dev-1", "", 12, 1, ""), // the mark stayed at 12/1
	}
	if r := history.Check(ok); !r.OK() {
		t.Fatalf("clean history fails: %v", r.Violations)
	}
	bad := append(ok, signed(8, "shim", "late", 1<<40, 1, "accepted", "gw-a/1"))
	r := history.Check(bad)
	if len(r.Violations) != 1 || r.Violations[0].Invariant != history.InvariantRevocation || r.Violations[0].ID != "late" {
		t.Fatalf("late accept of a revoked key: %v", r.Violations)
	}
	// A newer list replaces the older: a key it no longer names (the
	// lists of fence/auth never drop one, but the check follows the
	// record) is not flagged.
	relisted := append(append([]history.Event(nil), ok...), list(8, "shim", "gw-c/1"),
		signed(9, "shim", "a3", 30, 1, "accepted", "gw-a/1"))
	if r := history.Check(relisted); !r.OK() {
		t.Fatalf("after a list without the key: %v", r.Violations)
	}
}
