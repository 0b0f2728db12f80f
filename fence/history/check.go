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
	Firmware      FirmwareCounts // firmware steps (fw.* kinds) among the accepts
	Violations    []Violation    // I1 ones (history order, then across fence points), then I4 ones by device and id, then FW1 ones by device and job, then T1 ones in history order
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
//   - FW1 (InvariantActivation): per device, at most one fw.activate
//     command of a firmware job accepted.
//   - T1 (InvariantRevocation): no accept, at a fence point, of a command
//     signed by a key the fence point's revocation list names, after the
//     OpTrust event that recorded the list (source order).
//   - With opts.RequireApplied, see CheckOptions.
//
// Before all of that, accepts that were never committed are discarded (and
// counted in Report.Uncommitted): an accept of source S for device D whose
// (token, seq) is above the (token, seq) carried by S's next OpOpened event
// for D (see the package doc). OpOpened events without a Device and events
// of unknown ops are ignored. CheckWith never fails: bad input shows up as
// violations.
func CheckWith(events []Event, opts CheckOptions) Report {
	c := newChecker(len(events))
	void := uncommitted(events)
	for i, e := range events {
		if void[i] {
			c.rep.Uncommitted++
			c.devices[e.Device] = true
			c.fenced[e.Device] = true
			continue
		}
		c.event(e)
	}
	c.rep.Devices = len(c.devices)
	c.orderAcrossPoints()
	c.fates()
	c.checkActivations()
	c.rep.Violations = append(c.rep.Violations, c.revoked.violations...)
	if opts.RequireApplied {
		c.requireApplied()
	}
	return c.rep
}

// checker is CheckWith's state: what one pass over the history learnt,
// and the report it builds.
type checker struct {
	rep       Report
	devices   map[string]bool
	fenced    map[string]bool // devices with fence point events
	created   map[key]int
	terminals map[key][]string
	accepted  map[key]int
	applied   map[key]int
	appliedOn map[string]bool // devices with OpApplied events
	last      map[point]accept
	accepts   map[string][]accept // per device, history order
	sources   map[string]map[string]bool
	fwJobs    map[jobKey][]accept // per firmware job at a device: its accepted fw.activate commands, one per id
	revoked   revocations
}

func newChecker(events int) *checker {
	return &checker{
		rep:       Report{Events: events, Terminal: map[string]int{}, FenceVerdicts: map[string]int{}},
		devices:   map[string]bool{},
		fenced:    map[string]bool{},
		created:   map[key]int{},
		terminals: map[key][]string{},
		accepted:  map[key]int{},
		applied:   map[key]int{},
		appliedOn: map[string]bool{},
		last:      map[point]accept{},
		accepts:   map[string][]accept{},
		sources:   map[string]map[string]bool{},
		fwJobs:    map[jobKey][]accept{},
		revoked:   revocations{bySource: map[string]map[string]string{}},
	}
}

// violation records a breach of inv by event e.
func (c *checker) violation(inv string, e Event, format string, args ...any) {
	c.violationOf(inv, key{e.Device, e.ID}, format, args...)
}

// violationOf records a breach of inv by the command k.
func (c *checker) violationOf(inv string, k key, format string, args ...any) {
	c.rep.Violations = append(c.rep.Violations, Violation{Invariant: inv, Device: k.dev, ID: k.id,
		Detail: fmt.Sprintf(format, args...)})
}

// event takes in one committed event, in history order.
func (c *checker) event(e Event) {
	k := key{e.Device, e.ID}
	switch e.Op {
	case OpOpened:
		if e.Device != "" {
			c.devices[e.Device] = true
		}
	case OpCreated:
		c.devices[e.Device] = true
		c.rep.Created++
		c.created[k]++
	case OpTerminal:
		c.devices[e.Device] = true
		c.rep.Terminal[e.Verdict]++
		c.terminals[k] = append(c.terminals[k], e.Verdict)
	case OpApplied:
		c.appliedEvent(e)
	case OpVerdict:
		c.verdict(e)
		c.revoked.verdict(e)
	case OpTrust:
		c.revoked.learned(e)
	}
}

// appliedEvent counts an OpApplied event; a second one for a command is
// an I1 breach.
func (c *checker) appliedEvent(e Event) {
	c.devices[e.Device] = true
	c.rep.Applied++
	c.appliedOn[e.Device] = true
	if e.ID == "" {
		return
	}
	k := key{e.Device, e.ID}
	if c.applied[k]++; c.applied[k] == 2 {
		c.violation(InvariantOrder, e, "applied twice: the device applied %d/%d again (source %s)", e.Token, e.Seq, e.Source)
	}
}

// verdict counts a fence point's decision and checks an accept against I1
// at its fence point.
func (c *checker) verdict(e Event) {
	c.rep.FenceVerdicts[e.Verdict]++
	if e.Device == "" {
		return // undecodable input addressed to no valid device
	}
	c.devices[e.Device] = true
	c.fenced[e.Device] = true
	if e.Verdict != verdictAccepted {
		return
	}
	if e.ID != "" {
		k := key{e.Device, e.ID}
		if c.accepted[k]++; c.accepted[k] > 1 {
			c.violation(InvariantOrder, e, "applied twice: accepted again as %d/%d by %s", e.Token, e.Seq, e.Source)
			return
		}
	}
	a := accept{tok: e.Token, seq: e.Seq, id: e.ID, src: e.Source, t: e.Time}
	c.orderAtPoint(e, a)
	c.firmwareStep(e)
	c.accepts[e.Device] = append(c.accepts[e.Device], a)
	if c.sources[e.Device] == nil {
		c.sources[e.Device] = map[string]bool{}
	}
	c.sources[e.Device][e.Source] = true
}

// orderAtPoint checks I1 at one fence point: the accept a (of event e)
// must be above the last one its source accepted for the device.
func (c *checker) orderAtPoint(e Event, a accept) {
	p := point{e.Device, e.Source}
	prev, ok := c.last[p]
	switch {
	case !ok || prev.less(a):
		c.last[p] = a
	case a.tok < prev.tok:
		c.violation(InvariantOrder, e, "stale accept: token %d/%d accepted by %s after token %d/%d (id %s)",
			a.tok, a.seq, a.src, prev.tok, prev.seq, prev.id)
	default:
		c.violation(InvariantOrder, e, "seq not increasing: %d/%d accepted by %s after %d/%d (id %s)",
			a.tok, a.seq, a.src, prev.tok, prev.seq, prev.id)
	}
}

// orderAcrossPoints checks I1 across the fence points of one device, their
// accepts merged by wall time.
func (c *checker) orderAcrossPoints() {
	for _, dev := range sortedKeys(c.accepts) {
		if len(c.sources[dev]) < 2 {
			continue
		}
		as := slices.Clone(c.accepts[dev])
		slices.SortStableFunc(as, func(a, b accept) int { return a.t.Compare(b.t) })
		var hi accept
		for _, a := range as {
			if a.tok < hi.tok && a.src != hi.src {
				c.violationOf(InvariantOrder, key{dev, a.id},
					"stale accept across fence points: token %d accepted by %s at %s, after token %d by %s at %s (id %s)",
					a.tok, a.src, a.t.Format(time.RFC3339Nano), hi.tok, hi.src, hi.t.Format(time.RFC3339Nano), hi.id)
			}
			if a.tok > hi.tok {
				hi = a
			}
		}
	}
}

// fates checks I4: one terminal state per created command, agreeing with
// the fence, by device and id.
func (c *checker) fates() {
	keys := make([]key, 0, len(c.created)+len(c.terminals))
	for k := range c.created {
		keys = append(keys, k)
	}
	for k := range c.terminals {
		if c.created[k] == 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		c.fate(k)
	}
}

// fate checks I4 for the command k.
func (c *checker) fate(k key) {
	n, ts := c.created[k], c.terminals[k]
	switch {
	case n > 1:
		c.violationOf(InvariantFate, k, "created %d times", n)
	case n == 0:
		c.violationOf(InvariantFate, k, "terminal state %s without a created command", strings.Join(ts, ", "))
	}
	switch {
	case n > 0 && len(ts) == 0:
		c.violationOf(InvariantFate, k, "lost: created, no terminal state")
	case len(ts) > 1:
		c.violationOf(InvariantFate, k, "terminal twice: %s", strings.Join(ts, ", "))
	}
	if len(ts) == 0 || !c.fenced[k.dev] || c.accepted[k] > 0 {
		return
	}
	switch ts[0] {
	case verdictAccepted:
		c.violationOf(InvariantFate, k, "acked accepted but the fence point never accepted it")
	case verdictDuplicate:
		c.violationOf(InvariantFate, k, "acked duplicate but the fence point never accepted it")
	}
}

// requireApplied is CheckOptions.RequireApplied: every command accepted
// for a device with OpApplied events was applied, unless still pending or
// failed after admission; by device and id.
func (c *checker) requireApplied() {
	var keys []key
	for k := range c.accepted {
		ts := c.terminals[k]
		switch {
		case !c.appliedOn[k.dev] || c.applied[k] > 0:
		case c.created[k] > 0 && len(ts) == 0: // pending
		case len(ts) > 0 && ts[0] != verdictAccepted && ts[0] != verdictDuplicate:
			// The agent was told it failed (say, the device refused
			// it after admission): not applied is the right outcome.
		default:
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		c.violationOf(InvariantFate, k, "accepted but never applied")
	}
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
