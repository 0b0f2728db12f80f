package fence_test

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
)

// A command as it travels: the holder that issued it, the holder's token and
// the seq under that token.
type command struct {
	holder int
	tok    fence.Token
	seq    uint64
}

type cmdKey struct {
	tok fence.Token
	seq uint64
}

func (c command) key() cmdKey { return cmdKey{c.tok, c.seq} }

// delivery is one command arriving at the fence point and the decision made.
type delivery struct {
	command
	first   bool // first arrival of this (token, seq); later ones are redeliveries
	verdict fence.Verdict
	before  fence.Mark
	after   fence.Mark
}

// drawDeliveries simulates lease holders and an unreliable network, and
// returns the order in which commands reach one fence point.
//
// Holders are granted the lease one after another; each grant gets a strictly
// higher token (an etcd revision, so with gaps). A holder issues commands with
// seq 1, 2, 3... under its token and keeps doing so after it has been
// superseded, as a paused process that wakes up does: it never learns in time.
// Any holder's queued commands can sit in the network for arbitrarily long
// while others are delivered (a paused holder, a partition, an outbox waiting
// to replay). Delivered commands may be delivered again later (QoS 1
// redelivery, outbox replay after a lost ack).
//
// With fifo set, each holder's commands first arrive in the order issued
// (one ordered channel per holder; the outbox replays in order), and only
// redeliveries are out of order. Without it, any pending command can arrive
// next.
func drawDeliveries(t *rapid.T, fifo bool) []command {
	nHolders := rapid.IntRange(1, 5).Draw(t, "holders")
	tokens := make([]fence.Token, nHolders)
	tok := fence.Token(rapid.Uint64Range(0, 1000).Draw(t, "firstRevision"))
	for i := range tokens {
		tok += fence.Token(rapid.Uint64Range(1, 3).Draw(t, "revisionGap"))
		tokens[i] = tok
	}

	granted := 1
	issued := make([]uint64, nHolders)
	queues := make([][]command, nHolders) // not yet delivered, in issue order
	var again []command                   // delivered, may arrive again
	var out []command

	deliver := func(mayDuplicate bool) {
		var pending []int // holders with queued commands
		for h, q := range queues {
			if len(q) > 0 {
				pending = append(pending, h)
			}
		}
		choices := len(pending)
		if len(again) > 0 {
			choices++
		}
		if choices == 0 {
			return
		}
		var c command
		if pick := rapid.IntRange(0, choices-1).Draw(t, "source"); pick == len(pending) {
			i := rapid.IntRange(0, len(again)-1).Draw(t, "redelivery")
			c = again[i]
			again = append(again[:i], again[i+1:]...)
		} else {
			h := pending[pick]
			i := 0
			if !fifo {
				i = rapid.IntRange(0, len(queues[h])-1).Draw(t, "overtake")
			}
			c = queues[h][i]
			queues[h] = append(queues[h][:i], queues[h][i+1:]...)
		}
		out = append(out, c)
		if mayDuplicate && rapid.IntRange(0, 3).Draw(t, "duplicate") == 0 {
			again = append(again, c)
		}
	}

	steps := rapid.IntRange(0, 150).Draw(t, "steps")
	for range steps {
		switch rapid.IntRange(0, 4).Draw(t, "action") {
		case 0: // the lease expires and the next holder is granted it
			if granted < nHolders {
				granted++
			}
		case 1, 2: // some holder, current or superseded, issues a command
			h := rapid.IntRange(0, granted-1).Draw(t, "issuer")
			issued[h]++
			queues[h] = append(queues[h], command{holder: h, tok: tokens[h], seq: issued[h]})
		default:
			deliver(true)
		}
	}
	// The network heals: everything still pending arrives eventually.
	for {
		n := len(out)
		deliver(false)
		if len(out) == n {
			return out
		}
	}
}

// runFencePoint feeds every arrival through Admit at one fence point.
func runFencePoint(cmds []command) ([]delivery, fence.Mark) {
	var m fence.Mark
	seen := make(map[cmdKey]bool)
	hist := make([]delivery, 0, len(cmds))
	for _, c := range cmds {
		d := delivery{command: c, first: !seen[c.key()], before: m}
		seen[c.key()] = true
		d.verdict, m = fence.Admit(m, c.tok, c.seq)
		d.after = m
		hist = append(hist, d)
	}
	return hist, m
}

// checkI1 checks invariant I1 on the accepted (applied) part of a history.
func checkI1(t *rapid.T, accepted []command) {
	applied := make(map[cmdKey]bool)
	var maxTok fence.Token
	for i, c := range accepted {
		if c.tok < maxTok {
			t.Fatalf("I1: accepted %d/%d after token %d was accepted", c.tok, c.seq, maxTok)
		}
		maxTok = c.tok
		if i > 0 {
			p := accepted[i-1]
			if c.tok < p.tok {
				t.Fatalf("I1: accepted tokens decrease: %d/%d then %d/%d", p.tok, p.seq, c.tok, c.seq)
			}
			if c.tok == p.tok && c.seq <= p.seq {
				t.Fatalf("I1: seqs under token %d not strictly increasing: %d then %d", c.tok, p.seq, c.seq)
			}
		}
		if applied[c.key()] {
			t.Fatalf("I1: %d/%d accepted twice (a duplicate was re-applied)", c.tok, c.seq)
		}
		applied[c.key()] = true
	}
}

// checkHistory checks a fence point's decisions against a specification
// written in terms of the history only (not of the mark): a command is stale
// iff a higher token was accepted before it, a duplicate iff (not stale and)
// the same token was accepted before with an equal or higher seq, and
// accepted otherwise; and the mark is always the last (= highest) accepted.
func checkHistory(t *rapid.T, cmds []command, hist []delivery, final fence.Mark) {
	if len(hist) != len(cmds) {
		t.Fatalf("%d deliveries, %d verdicts", len(cmds), len(hist))
	}
	var acc []command
	for i, d := range hist {
		if d.command != cmds[i] {
			t.Fatalf("delivery %d: verdict recorded for %+v, delivered %+v", i, d.command, cmds[i])
		}
		switch d.verdict {
		case fence.Accepted, fence.Duplicate, fence.Stale:
		default:
			t.Fatalf("delivery %d (%d/%d): verdict %v; valid commands are accepted, duplicate or stale", i, d.tok, d.seq, d.verdict)
		}
		stale, dup := false, false
		for _, a := range acc {
			stale = stale || a.tok > d.tok
			dup = dup || a.tok == d.tok && a.seq >= d.seq
		}
		want := fence.Accepted
		switch {
		case stale:
			want = fence.Stale
		case dup:
			want = fence.Duplicate
		}
		if d.verdict != want {
			t.Fatalf("delivery %d (%d/%d) after mark %v: verdict %v, want %v", i, d.tok, d.seq, d.before, d.verdict, want)
		}
		if d.verdict != fence.Accepted && d.after != d.before {
			t.Fatalf("delivery %d: verdict %v moved the mark %v → %v", i, d.verdict, d.before, d.after)
		}
		if d.verdict == fence.Accepted {
			acc = append(acc, d.command)
		}
		var top fence.Mark
		if len(acc) > 0 {
			last := acc[len(acc)-1]
			top = fence.Mark{Token: last.tok, Seq: last.seq}
		}
		if d.after != top {
			t.Fatalf("delivery %d: mark %v, highest accepted %v", i, d.after, top)
		}
	}
	checkI1(t, acc)
	var want fence.Mark
	for _, a := range acc { // the maximum, computed without relying on order
		if a.tok > want.Token || a.tok == want.Token && a.seq > want.Seq {
			want = fence.Mark{Token: a.tok, Seq: a.seq}
		}
	}
	if final != want {
		t.Fatalf("final mark %v, max accepted %v", final, want)
	}
}

func TestPropAdmitI1(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cmds := drawDeliveries(t, rapid.Bool().Draw(t, "fifo"))
		hist, final := runFencePoint(cmds)
		checkHistory(t, cmds, hist, final)
		for _, d := range hist {
			if !d.first && d.verdict == fence.Accepted {
				t.Fatalf("redelivery of %d/%d was accepted", d.tok, d.seq)
			}
		}
	})
}

// With per-holder ordered delivery (what MQTT QoS 1 on one topic and the
// in-order outbox replay give), a Duplicate verdict always means "already
// applied", and a command is refused only when a newer holder has been
// accepted: nothing is lost silently (I4).
func TestPropAdmitFIFONoSilentLoss(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cmds := drawDeliveries(t, true)
		hist, _ := runFencePoint(cmds)
		applied := make(map[cmdKey]bool)
		for _, d := range hist {
			switch d.verdict {
			case fence.Duplicate:
				if !applied[d.key()] {
					t.Fatalf("%d/%d answered duplicate but was never applied", d.tok, d.seq)
				}
			case fence.Stale:
				if d.before.Token <= d.tok {
					t.Fatalf("%d/%d stale under mark %v", d.tok, d.seq, d.before)
				}
			case fence.Accepted:
				applied[d.key()] = true
			}
			if d.first && d.tok >= d.before.Token && d.verdict != fence.Accepted {
				t.Fatalf("first arrival of %d/%d under mark %v: %v, want accepted", d.tok, d.seq, d.before, d.verdict)
			}
		}
	})
}

// TestAdmitOvertakenSeqIsDuplicate documents a limit of the (token, lastSeq)
// mark: if a later seq of the same token overtakes an earlier one, the
// earlier one is answered Duplicate although it was never applied. Senders
// must therefore deliver each token's commands in order (one ordered channel,
// in-order outbox replay); TestPropAdmitFIFONoSilentLoss shows that then
// Duplicate always means "already applied".
func TestAdmitOvertakenSeqIsDuplicate(t *testing.T) {
	m := fence.Mark{}
	_, m = fence.Admit(m, 7, 1)
	_, m = fence.Admit(m, 7, 3) // seq 2 is still in flight
	if v, _ := fence.Admit(m, 7, 2); v != fence.Duplicate {
		t.Fatalf("overtaken seq: %v, want duplicate", v)
	}
}

// A fence point that persists its mark only on Accepted (I3: durable before
// effect) and restarts at arbitrary points, reloading the persisted mark,
// decides exactly as one that never restarted.
func TestPropRestartEquivalence(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cmds := drawDeliveries(t, rapid.Bool().Draw(t, "fifo"))
		var live, mem, disk fence.Mark
		for i, c := range cmds {
			if rapid.IntRange(0, 4).Draw(t, "restart") == 0 {
				mem = disk // the process dies; memory is lost; the mark is reloaded
			}
			v1, next1 := fence.Admit(live, c.tok, c.seq)
			v2, next2 := fence.Admit(mem, c.tok, c.seq)
			if v2 == fence.Accepted {
				disk = next2 // persisted (fsync) before the command takes effect
			}
			live, mem = next1, next2
			if v1 != v2 || live != mem {
				t.Fatalf("delivery %d (%d/%d): never-restarted point says %v → %v, restarted point %v → %v",
					i, c.tok, c.seq, v1, live, v2, mem)
			}
		}
	})
}

// A fence point that crashes after deciding Accepted but before its mark is
// durable never applied that command (I3), and the sender will redeliver it.
// Its applied history still satisfies I1.
func TestPropCrashBeforePersist(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cmds := drawDeliveries(t, rapid.Bool().Draw(t, "fifo"))
		var mem, disk fence.Mark
		var applied []command
		for _, c := range cmds {
			v, next := fence.Admit(mem, c.tok, c.seq)
			if v == fence.Accepted && rapid.IntRange(0, 5).Draw(t, "crashBeforeFsync") == 0 {
				mem = disk // the decision is lost with the process; nothing applied
				continue
			}
			if v == fence.Accepted {
				disk = next
				applied = append(applied, c)
			}
			mem = next
			if rapid.IntRange(0, 9).Draw(t, "restart") == 0 {
				mem = disk
			}
		}
		checkI1(t, applied)
	})
}

// Devices short of flash may persist only on token change (I3, for
// idempotent commands). After a restart they may re-apply commands of the
// current token, but the token part of I1 still holds across restarts, and
// nothing is applied twice between two restarts.
func TestPropTokenOnlyPersistence(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cmds := drawDeliveries(t, rapid.Bool().Draw(t, "fifo"))
		var mem, disk fence.Mark
		var maxTok fence.Token
		sinceRestart := make(map[cmdKey]bool)
		for _, c := range cmds {
			if rapid.IntRange(0, 4).Draw(t, "restart") == 0 {
				mem = disk
				clear(sinceRestart)
			}
			v, next := fence.Admit(mem, c.tok, c.seq)
			if v == fence.Accepted {
				if next.Token != disk.Token {
					disk = next // token changed: persist before effect
				}
				if c.tok < maxTok {
					t.Fatalf("I1: token %d applied after token %d", c.tok, maxTok)
				}
				maxTok = c.tok
				if sinceRestart[c.key()] {
					t.Fatalf("%d/%d applied twice without a restart in between", c.tok, c.seq)
				}
				sinceRestart[c.key()] = true
			}
			mem = next
			if disk.Token != mem.Token {
				t.Fatalf("durable token %d, in memory %d", disk.Token, mem.Token)
			}
		}
	})
}

// Codec properties.

var (
	genDeviceID = rapid.StringMatching(`[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}`)
	genName     = rapid.StringMatching(`[A-Za-z0-9._:/-]{1,64}`)
)

// genValue draws a body value of the Go types DecodeBody produces for `any`,
// nested at most depth levels.
func genValue(t *rapid.T, depth int) any {
	kinds := 7
	if depth > 0 {
		kinds = 9
	}
	switch rapid.IntRange(0, kinds-1).Draw(t, "kind") {
	case 0:
		return rapid.Uint64().Draw(t, "uint")
	case 1:
		return rapid.Int64Max(-1).Draw(t, "negint")
	case 2:
		return rapid.String().Draw(t, "text")
	case 3:
		return append([]byte{}, rapid.SliceOfN(rapid.Byte(), 0, 16).Draw(t, "bytes")...)
	case 4:
		return rapid.Bool().Draw(t, "bool")
	case 5:
		return nil
	case 6:
		f := rapid.Float64().Draw(t, "float")
		if math.IsNaN(f) {
			f = 0
		}
		return f
	case 7:
		n := rapid.IntRange(0, 5).Draw(t, "arrayLen")
		a := make([]any, n)
		for i := range a {
			a[i] = genValue(t, depth-1)
		}
		return a
	default:
		n := rapid.IntRange(0, 5).Draw(t, "mapLen")
		m := make(map[string]any, n)
		for range n {
			m[rapid.String().Draw(t, "key")] = genValue(t, depth-1)
		}
		return m
	}
}

func drawEnvelope(t *rapid.T) (*fence.Envelope, any) {
	e := &fence.Envelope{
		V:      fence.Version,
		Device: genDeviceID.Draw(t, "device"),
		Token:  fence.Token(rapid.Uint64Min(1).Draw(t, "token")),
		Seq:    rapid.Uint64Min(1).Draw(t, "seq"),
		ID:     genName.Draw(t, "id"),
		Kind:   genName.Draw(t, "kind"),
	}
	if rapid.Bool().Draw(t, "hasIssuedAt") {
		e.IssuedAt = rapid.Int64().Draw(t, "issuedAt")
	}
	if rapid.Bool().Draw(t, "hasHolder") {
		e.Holder = rapid.StringN(0, 32, fence.MaxHolderLen).Draw(t, "holder")
	}
	var body any
	if rapid.Bool().Draw(t, "hasBody") {
		body = genValue(t, rapid.IntRange(0, 4).Draw(t, "depth"))
		b, err := fence.EncodeBody(body)
		if err != nil {
			t.Fatalf("EncodeBody(%#v): %v", body, err)
		}
		e.Body = b
	}
	return e, body
}

func TestPropEnvelopeRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e, body := drawEnvelope(t)
		b, err := fence.MarshalEnvelope(e)
		if err != nil {
			t.Fatalf("MarshalEnvelope(%+v): %v", e, err)
		}
		if len(b) > fence.MaxEnvelopeSize {
			t.Fatalf("encoded %d bytes", len(b))
		}
		again, err := fence.MarshalEnvelope(e)
		if err != nil || !bytes.Equal(b, again) {
			t.Fatalf("encoding not deterministic:\n%x\n%x", b, again)
		}
		got, err := fence.UnmarshalEnvelope(b)
		if err != nil {
			t.Fatalf("UnmarshalEnvelope(%x): %v", b, err)
		}
		if !equalEnvelope(got, e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, e)
		}
		if b2, err := fence.MarshalEnvelope(got); err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs:\n%x\n%x (%v)", b2, b, err)
		}
		if e.Body != nil {
			var v any
			if err := fence.DecodeBody(got.Body, &v); err != nil {
				t.Fatalf("DecodeBody: %v", err)
			}
			if !reflect.DeepEqual(v, body) {
				t.Fatalf("body round trip:\n got %#v\nwant %#v", v, body)
			}
		}
		// A random strict prefix never decodes.
		n := rapid.IntRange(0, len(b)-1).Draw(t, "prefix")
		if _, err := fence.UnmarshalEnvelope(b[:n]); err == nil {
			t.Fatalf("prefix of %d/%d bytes decoded", n, len(b))
		}
	})
}

func TestPropAckRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := &fence.Ack{
			V:        fence.Version,
			Verdict:  fence.Verdict(rapid.IntRange(int(fence.Accepted), int(fence.Expired)).Draw(t, "verdict")),
			Token:    fence.Token(rapid.Uint64().Draw(t, "token")),
			Seq:      rapid.Uint64().Draw(t, "seq"),
			MaxToken: fence.Token(rapid.Uint64().Draw(t, "maxToken")),
			LastSeq:  rapid.Uint64().Draw(t, "lastSeq"),
			Reason:   rapid.StringN(0, 64, fence.MaxReasonLen).Draw(t, "reason"),
		}
		if rapid.Bool().Draw(t, "readable") {
			a.Device = genDeviceID.Draw(t, "device")
			a.ID = genName.Draw(t, "id")
		}
		b, err := fence.MarshalAck(a)
		if err != nil {
			t.Fatalf("MarshalAck(%+v): %v", a, err)
		}
		got, err := fence.UnmarshalAck(b)
		if err != nil {
			t.Fatalf("UnmarshalAck(%x): %v", b, err)
		}
		if *got != *a {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, a)
		}
		if b2, err := fence.MarshalAck(got); err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs")
		}
		if err := got.Err(); (err == nil) != (a.Verdict == fence.Accepted) {
			t.Fatalf("verdict %v: Err() = %v", a.Verdict, err)
		}
	})
}
