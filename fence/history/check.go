package history

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Verdict names as fence.Verdict.String spells them. (Spelled out here so
// that this package depends on nothing but the standard library.)
const (
	verdictAccepted  = "accepted"
	verdictDuplicate = "duplicate"
)

// Invariants a Violation can name (docs/ARCHITECTURE.md).
const (
	// InvariantOrder is I1: per device, accepted (token, seq) strictly
	// increase and no command takes effect twice.
	InvariantOrder = "I1"
	// InvariantFate is I4: every command created has exactly one terminal
	// state, and that state agrees with the fence point.
	InvariantFate = "I4"
)

// Violation is one breach of an invariant found in a history.
type Violation struct {
	Invariant string // InvariantOrder or InvariantFate
	Device    string
	ID        string // command id; empty when the breach has none
	Detail    string
}

// String formats v on one line.
func (v Violation) String() string {
	return fmt.Sprintf("%s %s %s: %s", v.Invariant, v.Device, v.ID, v.Detail)
}

// Report is what Check found in a history.
type Report struct {
	Events        int            // events checked
	Devices       int            // distinct devices named by any event
	Created       int            // OpCreated events
	Applied       int            // OpApplied events
	Terminal      map[string]int // OpTerminal events by verdict
	FenceVerdicts map[string]int // OpVerdict events by verdict, without the uncommitted accepts
	Uncommitted   int            // accepts discarded as never committed (a later OpOpened of their source says so)
	Violations    []Violation    // I1 ones (history order, then across fence points), then I4 ones by device and id
}

// OK reports whether the history breaks no invariant.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// CheckOptions tune CheckWith. The zero value is Check's behaviour.
type CheckOptions struct {
	// RequireApplied makes every command a fence point accepted for a
	// device that has OpApplied events (a gateway-fenced device: the
	// bridge records the serial device's answer) need an OpApplied event
	// too, unless it is still pending (created, no terminal state yet) or
	// its terminal state is neither accepted nor duplicate (the device
	// refused it after admission, say). Use it on a history taken at
	// quiescence.
	RequireApplied bool
}

// Check checks events (as Read returns them: each source's events in its
// own order) against I1 and I4 with the default options.
func Check(events []Event) Report { return CheckWith(events, CheckOptions{}) }

// key names one command.
type key struct{ dev, id string }

// point is one fence point's sequence of decisions for one device.
type point struct{ dev, src string }

type accept struct {
	tok, seq uint64
	id, src  string
	t        time.Time
}

func (a accept) less(b accept) bool {
	return a.tok < b.tok || a.tok == b.tok && a.seq < b.seq
}

// CheckWith checks events against the invariants:
//
//   - I1, per fence point: for each (device, source), the accepted
//     (token, seq) pairs strictly increase in the order the source recorded
//     them; a command id accepted twice for a device (by any source) is
//     "applied twice", and so is an id with two OpApplied events. When
//     several sources accept for one device, their accepts are also merged
//     by Time (the only use of clocks): no source may accept a token below
//     one another source accepted earlier.
//   - I4: every OpCreated command has exactly one OpTerminal ("lost" with
//     none, "terminal twice" with more); an OpTerminal without OpCreated is
//     a violation too. For devices whose fence point history is present
//     (any OpVerdict event), a terminal "accepted" or "duplicate" needs a
//     fence accept of the same id somewhere in the history.
//   - With opts.RequireApplied, see CheckOptions.
//
// Before all of that, accepts that were never committed are discarded (and
// counted in Report.Uncommitted): an accept of source S for device D whose
// (token, seq) is above the (token, seq) carried by S's next OpOpened event
// for D (see the package doc). OpOpened events without a Device and events
// of unknown ops are ignored. CheckWith never fails: bad input shows up as
// violations.
func CheckWith(events []Event, opts CheckOptions) Report {
	rep := Report{Events: len(events), Terminal: map[string]int{}, FenceVerdicts: map[string]int{}}
	var (
		devices   = map[string]bool{}
		fenced    = map[string]bool{} // devices with fence point events
		created   = map[key]int{}
		terminals = map[key][]string{}
		accepted  = map[key]int{}
		applied   = map[key]int{}
		appliedOn = map[string]bool{}
		last      = map[point]accept{}
		accepts   = map[string][]accept{} // per device, history order
		sources   = map[string]map[string]bool{}
	)
	add := func(inv string, e Event, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{Invariant: inv, Device: e.Device, ID: e.ID,
			Detail: fmt.Sprintf(format, args...)})
	}
	acc := verdictAccepted
	void := uncommitted(events)
	for i, e := range events {
		k := key{e.Device, e.ID}
		if void[i] {
			rep.Uncommitted++
			devices[e.Device] = true
			fenced[e.Device] = true
			continue
		}
		switch e.Op {
		case OpOpened:
			if e.Device != "" {
				devices[e.Device] = true
			}
		case OpCreated:
			devices[e.Device] = true
			rep.Created++
			created[k]++
		case OpTerminal:
			devices[e.Device] = true
			rep.Terminal[e.Verdict]++
			terminals[k] = append(terminals[k], e.Verdict)
		case OpApplied:
			devices[e.Device] = true
			rep.Applied++
			appliedOn[e.Device] = true
			if e.ID == "" {
				continue
			}
			if applied[k]++; applied[k] == 2 {
				add(InvariantOrder, e, "applied twice: the device applied %d/%d again (source %s)", e.Token, e.Seq, e.Source)
			}
		case OpVerdict:
			rep.FenceVerdicts[e.Verdict]++
			if e.Device == "" {
				continue // undecodable input addressed to no valid device
			}
			devices[e.Device] = true
			fenced[e.Device] = true
			if e.Verdict != acc {
				continue
			}
			a := accept{tok: e.Token, seq: e.Seq, id: e.ID, src: e.Source, t: e.Time}
			if e.ID != "" {
				if accepted[k]++; accepted[k] > 1 {
					add(InvariantOrder, e, "applied twice: accepted again as %d/%d by %s", e.Token, e.Seq, e.Source)
					continue
				}
			}
			p := point{e.Device, e.Source}
			if prev, ok := last[p]; ok && !prev.less(a) {
				if a.tok < prev.tok {
					add(InvariantOrder, e, "stale accept: token %d/%d accepted by %s after token %d/%d (id %s)",
						a.tok, a.seq, a.src, prev.tok, prev.seq, prev.id)
				} else {
					add(InvariantOrder, e, "seq not increasing: %d/%d accepted by %s after %d/%d (id %s)",
						a.tok, a.seq, a.src, prev.tok, prev.seq, prev.id)
				}
			} else {
				last[p] = a
			}
			accepts[e.Device] = append(accepts[e.Device], a)
			if sources[e.Device] == nil {
				sources[e.Device] = map[string]bool{}
			}
			sources[e.Device][e.Source] = true
		}
	}
	rep.Devices = len(devices)

	// I1 across fence points of one device, merged by wall time.
	for _, dev := range sortedKeys(accepts) {
		if len(sources[dev]) < 2 {
			continue
		}
		as := slices.Clone(accepts[dev])
		slices.SortStableFunc(as, func(a, b accept) int { return a.t.Compare(b.t) })
		var hi accept
		for _, a := range as {
			if a.tok < hi.tok && a.src != hi.src {
				rep.Violations = append(rep.Violations, Violation{Invariant: InvariantOrder, Device: dev, ID: a.id,
					Detail: fmt.Sprintf("stale accept across fence points: token %d accepted by %s at %s, after token %d by %s at %s (id %s)",
						a.tok, a.src, a.t.Format(time.RFC3339Nano), hi.tok, hi.src, hi.t.Format(time.RFC3339Nano), hi.id)})
			}
			if a.tok > hi.tok {
				hi = a
			}
		}
	}

	// I4: one terminal state per created command, agreeing with the fence.
	keys := make([]key, 0, len(created)+len(terminals))
	for k := range created {
		keys = append(keys, k)
	}
	for k := range terminals {
		if created[k] == 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		v := func(format string, args ...any) {
			rep.Violations = append(rep.Violations, Violation{Invariant: InvariantFate, Device: k.dev, ID: k.id,
				Detail: fmt.Sprintf(format, args...)})
		}
		c, ts := created[k], terminals[k]
		switch {
		case c > 1:
			v("created %d times", c)
		case c == 0:
			v("terminal state %s without a created command", strings.Join(ts, ", "))
		}
		switch {
		case c > 0 && len(ts) == 0:
			v("lost: created, no terminal state")
		case len(ts) > 1:
			v("terminal twice: %s", strings.Join(ts, ", "))
		}
		if len(ts) == 0 || !fenced[k.dev] || accepted[k] > 0 {
			continue
		}
		switch ts[0] {
		case acc:
			v("acked accepted but the fence point never accepted it")
		case verdictDuplicate:
			v("acked duplicate but the fence point never accepted it")
		}
	}

	if opts.RequireApplied {
		keys = keys[:0]
		for k := range accepted {
			ts := terminals[k]
			switch {
			case !appliedOn[k.dev] || applied[k] > 0:
			case created[k] > 0 && len(ts) == 0: // pending
			case len(ts) > 0 && ts[0] != verdictAccepted && ts[0] != verdictDuplicate:
				// The agent was told it failed (say, the device refused
				// it after admission): not applied is the right outcome.
			default:
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, cmpKey)
		for _, k := range keys {
			rep.Violations = append(rep.Violations, Violation{Invariant: InvariantFate, Device: k.dev, ID: k.id,
				Detail: "accepted but never applied"})
		}
	}
	return rep
}

func cmpKey(a, b key) int {
	return cmp.Or(cmp.Compare(a.dev, b.dev), cmp.Compare(a.id, b.id))
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
