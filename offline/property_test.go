package offline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// modelEntry is what the property test expects of one appended id.
type modelEntry struct {
	e        *offline.Entry
	state    fence.Verdict // 0 pending
	resolved time.Time
	gone     bool // compacted
}

// TestPropertyOneTerminalState runs random appends (without a body, with a
// small one, with one over KeepBodyMax), resolves (including second
// resolves), clock advances with expiry, compactions and reopens against a
// model, and checks after every step: every appended id is in the outbox
// with the model's state (at most one terminal state, never changed once
// set) and its body (kept while pending, dropped once terminal if larger
// than KeepBodyMax), pending entries of each device are listed and
// delivered, whole, in append order, and an id is gone only after Compact
// ran at least Retention after its terminal state.
func TestPropertyOneTerminalState(t *testing.T) {
	devices := []string{"d-a", "d-b", "d-c"}
	rapid.Check(t, func(rt *rapid.T) {
		clk := newClock()
		const ttl, retention = 30 * time.Second, time.Minute
		opts := &offline.Options{Now: clk.Now, TTL: ttl, Retention: retention}
		path := dbPath(t)
		ob, err := offline.Open(path, opts)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { ob.Close() }()
		model := map[string]*modelEntry{}
		var ids []string
		order := map[string][]string{} // device → ids in append order
		n := 0

		rt.Repeat(map[string]func(*rapid.T){
			"append": func(rt *rapid.T) {
				dev := rapid.SampledFrom(devices).Draw(rt, "device")
				n++
				id := fmt.Sprintf("c-%d", n)
				e := entry(dev, id, fence.Token(rapid.Uint64Range(1, 5).Draw(rt, "token")), uint64(n))
				switch rapid.IntRange(0, 2).Draw(rt, "body") { // none, kept, dropped once terminal
				case 1:
					e.Envelope.Body = []byte{0x42, 'o', 'n'}
				case 2:
					e.Envelope.Body = bodyOf(t, offline.KeepBodyMax+1+n, byte(n))
				}
				if rapid.Bool().Draw(rt, "ownTTL") {
					e.TTL = time.Duration(rapid.IntRange(1, 90).Draw(rt, "ttl")) * time.Second
				}
				if err := ob.Append(context.Background(), e); err != nil {
					rt.Fatal(err)
				}
				model[id] = &modelEntry{e: e}
				ids = append(ids, id)
				order[dev] = append(order[dev], id)
			},
			"resolve": func(rt *rapid.T) {
				if len(ids) == 0 {
					rt.Skip("nothing appended")
				}
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				m := model[id]
				v := fence.Verdict(rapid.IntRange(int(fence.Accepted), int(fence.Invalid)).Draw(rt, "verdict"))
				err := ob.Resolve(id, ack(m.e, v, "r"))
				switch {
				case m.gone:
					if !errors.Is(err, offline.ErrNotFound) {
						rt.Fatalf("resolve compacted %s: %v", id, err)
					}
				case m.state != 0:
					if !errors.Is(err, offline.ErrResolved) {
						rt.Fatalf("second resolve of %s: %v", id, err)
					}
				case err != nil:
					rt.Fatalf("resolve %s: %v", id, err)
				default:
					m.state, m.resolved = v, clk.Now().Truncate(time.Millisecond)
				}
			},
			"advanceAndExpire": func(rt *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(0, 40_000).Draw(rt, "ms")) * time.Millisecond)
				now := clk.Now()
				want := 0
				for _, m := range model {
					if m.state == 0 && !m.gone && !now.Before(m.e.Deadline) {
						m.state, m.resolved = fence.Expired, now.Truncate(time.Millisecond)
						want++
					}
				}
				if got, err := ob.ExpireDue(); err != nil || got != want {
					rt.Fatalf("expired %d (%v), want %d", got, err, want)
				}
			},
			"compact": func(rt *rapid.T) {
				now := clk.Now()
				want := 0
				for _, m := range model {
					if m.state != 0 && !m.gone && !m.resolved.Add(retention).After(now) {
						m.gone = true
						want++
					}
				}
				if got, err := ob.Compact(); err != nil || got != want {
					rt.Fatalf("compacted %d (%v), want %d", got, err, want)
				}
			},
			"reopen": func(rt *rapid.T) {
				if err := ob.Close(); err != nil {
					rt.Fatal(err)
				}
				if ob, err = offline.Open(path, opts); err != nil {
					rt.Fatal(err)
				}
			},
			"": func(rt *rapid.T) { // the invariants, after every step
				for _, id := range ids {
					m := model[id]
					r, err := ob.Get(id)
					if m.gone {
						if !errors.Is(err, offline.ErrNotFound) {
							rt.Fatalf("%s compacted, but get: %v", id, err)
						}
						continue
					}
					if err != nil {
						rt.Fatalf("%s disappeared: %v", id, err)
					}
					if r.State != m.state {
						rt.Fatalf("%s state %v, want %v", id, r.StateString(), m.state)
					}
					if err := bodyErr(r, m.e.Envelope.Body); err != nil {
						rt.Fatal(err)
					}
				}
				total := 0
				for _, dev := range devices {
					var want []string
					for _, id := range order[dev] {
						if model[id].state == 0 {
							want = append(want, id)
						}
					}
					recs, err := ob.List(offline.Filter{Device: dev, PendingOnly: true})
					if err != nil {
						rt.Fatal(err)
					}
					var got []string
					for _, r := range recs {
						got = append(got, r.ID)
					}
					if !slices.Equal(got, want) {
						rt.Fatalf("%s pending %v, want %v", dev, got, want)
					}
					e, ok, err := ob.Next(dev)
					if err != nil || ok != (len(want) > 0) || ok && (e.Envelope.ID != want[0] || !bytes.Equal(e.Raw, model[want[0]].e.Raw)) {
						rt.Fatalf("%s next %v %v %v, want %v", dev, e, ok, err, want)
					}
					if c, _ := ob.Pending(dev); c != len(want) {
						rt.Fatalf("%s pending count %d, want %d", dev, c, len(want))
					}
					total += len(want)
				}
				s, err := ob.Stats()
				if err != nil || s.Pending != total {
					rt.Fatalf("stats %+v %v, want %d pending", s, err, total)
				}
			},
		})
	})
}
