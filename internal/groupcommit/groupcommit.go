// Package groupcommit commits concurrent bbolt write transactions together:
// one fsync for a group of calls instead of one each, without a timer.
//
// The first call of a group leads it: it waits for the commit of the group
// before (every call that arrives meanwhile joins its group), yields
// (runtime.Gosched) while the group still grows, then closes the group and
// runs every call in one transaction, in arrival order, so that each sees
// what the calls before it wrote. A lone call commits at once; a full
// group (the maximum size) closes at once. If the group's transaction
// fails, bbolt has rolled it back and every call is run again alone, so
// that one bad call fails only itself. Commit returns only once the
// transaction holding the call's writes has committed (fsynced), or failed.
//
// A Call may therefore run more than once, each time in a fresh
// transaction: it must decide from what that transaction holds. bbolt's own
// DB.Batch waits on a timer for company; docs/BENCHMARKS.md §24 measures
// both: this approach wins at one writer, the common case on a gateway,
// and at 8 and 64.
//
// Riders (Ride) are calls whose caller does not wait: they are parked
// without a leader and taken, ahead of its own calls, into the next group
// that closes — any caller's — or into the one CommitRiders leads; a
// callback gets their errors. The outbox parks a delivered command's
// verdict this way, so that it costs no fsync of its own: it rides on the
// next command's append (docs/BENCHMARKS.md, "One outbox commit per
// command").
package groupcommit

import (
	"runtime"
	"sync"

	"go.etcd.io/bbolt"
)

// Call does one caller's writes in tx.
type Call func(tx *bbolt.Tx) error

// rider is one Ride: calls parked until a group takes them, and the
// callback that gets their errors.
type rider struct {
	calls []Call
	done  func(errs []error)
}

// DefaultMaxGroup caps the calls committed in one transaction.
const DefaultMaxGroup = 256

// maxIdleYields is how many yields in a row that brought no call into a
// group end its leader's wait for company.
const maxIdleYields = 16

// Committer groups the calls of concurrent callers. The zero value is not
// usable: use New.
type Committer struct {
	update func(func(*bbolt.Tx) error) error
	max    int

	mu     sync.Mutex
	open   *group  // accepting calls; nil when none is
	last   *group  // the group committed last or being committed
	riders []rider // parked (Ride), for the next group to close
}

type group struct {
	calls  []Call
	riders []rider       // taken when the group closed; their calls run first
	errs   []error       // set before done is closed
	prev   *group        // the group committed before this one; nil once it has
	done   chan struct{} // closed when the commit returned
}

// New returns a Committer whose transactions run through update (e.g.
// (*bbolt.DB).Update, or a wrapper that also times the commit), at most
// maxGroup calls each (DefaultMaxGroup if maxGroup ≤ 0).
func New(update func(func(*bbolt.Tx) error) error, maxGroup int) *Committer {
	if maxGroup <= 0 {
		maxGroup = DefaultMaxGroup
	}
	return &Committer{update: update, max: maxGroup}
}

// Commit runs fn in a committed transaction, its own or its group's, and
// returns fn's error or the transaction's.
func (c *Committer) Commit(fn Call) error {
	return c.CommitMany([]Call{fn})[0]
}

// CommitMany runs calls, in order, in one committed transaction shared
// with concurrent callers' (a group may exceed the maximum size by the
// calls of one CommitMany), and returns each call's error or the
// transaction's. One caller's batch (e.g. one device's verdicts) costs one
// fsync, like one call.
func (c *Committer) CommitMany(calls []Call) []error {
	c.mu.Lock()
	g := c.open
	lead := g == nil
	if lead {
		g = &group{prev: c.last, done: make(chan struct{})}
		c.open, c.last = g, g
	}
	i := len(g.calls)
	g.calls = append(g.calls, calls...)
	if len(g.calls) >= c.max {
		c.open = nil // full: later calls form the next group
	}
	c.mu.Unlock()

	if !lead {
		<-g.done
		return g.errs[i : i+len(calls)]
	}
	if g.prev != nil {
		<-g.prev.done // one commit at a time, in group order
		g.prev = nil
	}
	c.gather(g)
	c.mu.Lock()
	if c.open == g {
		c.open = nil
	}
	g.riders, c.riders = c.riders, nil
	var all []Call // no more appends: the group is closed
	for _, r := range g.riders {
		all = append(all, r.calls...)
	}
	off := len(all)
	all = append(all, g.calls...)
	c.mu.Unlock()
	var errs []error
	if len(all) > 0 { // a flush (CommitRiders) of nothing commits nothing
		errs = CommitAll(c.update, all)
	}
	riders, own := g.riders, errs[off:]
	for _, r := range riders { // before the group's callers go on: a flush returns after its riders' callbacks
		n := len(r.calls)
		r.done(errs[:n:n])
		errs = errs[n:]
	}
	c.mu.Lock()
	g.calls, g.riders, g.errs = nil, nil, own // c.last must not keep the calls alive
	c.mu.Unlock()
	close(g.done)
	return own[i : i+len(calls)]
}

// Ride parks calls, in order, to be committed with the next group that
// closes (a Commit or CommitMany of any caller, or CommitRiders), and
// returns at once. done gets each call's error, as CommitMany returns
// them, once that group's transaction has committed (fsynced) or failed;
// it runs on the goroutine of the group's leader before the group's
// callers are released (and before the next group commits): it must be
// quick and must not call the Committer. Until some caller commits, nothing does: the caller that
// parks calls arranges for CommitRiders to run at the latest when it
// wants them durable.
func (c *Committer) Ride(calls []Call, done func(errs []error)) {
	if len(calls) == 0 {
		done(nil)
		return
	}
	c.mu.Lock()
	c.riders = append(c.riders, rider{calls: calls, done: done})
	c.mu.Unlock()
}

// CommitRiders commits the parked calls now, as a group that others may
// join (or with the group forming now, if there is one), and returns once
// the done callbacks of every call parked before it have run — those a
// group being committed took too: it waits for that group. With nothing
// parked or being committed it returns at once.
func (c *Committer) CommitRiders() {
	c.mu.Lock()
	none := len(c.riders) == 0 && c.open == nil
	last := c.last
	c.mu.Unlock()
	switch {
	case !none:
		c.CommitMany(nil)
	case last != nil:
		<-last.done
	}
}

// Riding reports how many Ride batches are parked.
func (c *Committer) Riding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.riders)
}

// gather lets the callers just woken by the previous commit (or arriving
// with this one) join g before it closes: the leader yields while the group
// grows, and stops after maxIdleYields yields in a row that brought no one.
// Yields, not a timer: alone they cost a few microseconds against a
// commit's hundreds. Fewer do not do: the woken callers queue on the P
// that woke them, and a yield on another P comes straight back.
func (c *Committer) gather(g *group) {
	for n, idle := 0, 0; idle < maxIdleYields; {
		runtime.Gosched()
		c.mu.Lock()
		switch {
		case c.open != g:
			idle = maxIdleYields // closed because full
		case len(g.calls) > n:
			idle = 0
		default:
			idle++
		}
		n = len(g.calls)
		c.mu.Unlock()
	}
}

// CommitAll runs calls in one transaction through update, in order, and
// returns each call's error. If that transaction fails (a call's error or
// the commit's), each call is run again alone, in its own transaction.
func CommitAll(update func(func(*bbolt.Tx) error) error, calls []Call) []error {
	errs := make([]error, len(calls))
	err := update(func(tx *bbolt.Tx) error {
		for _, fn := range calls {
			if err := fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(calls) == 1 {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, fn := range calls {
		errs[i] = update(fn)
	}
	return errs
}
