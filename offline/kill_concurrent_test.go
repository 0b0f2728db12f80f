package offline_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// killWriters is how many goroutines of outboxConcurrentHelper append at
// once.
const killWriters = 16

// outboxConcurrentHelper appends from killWriters goroutines at once, each
// one entry at a time (ids p<pid>-<i>, i unique, over four devices), and
// prints "ok ID" once its Append returned; every writer resolves its own
// entry after every third append and prints "res ID" once Resolve
// returned. Appends and resolves of the writers share commits (the group
// commit): a kill lands in the middle of groups.
func outboxConcurrentHelper(ob *offline.Outbox, w *bufio.Writer) int {
	var mu sync.Mutex
	say := func(a ...any) { mu.Lock(); fmt.Fprintln(w, a...); w.Flush(); mu.Unlock() }
	deadline := time.Now().Add(time.Minute) // never outlive a broken parent for long
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range killWriters {
		wg.Go(func() {
			for n := 0; time.Now().Before(deadline) && !failed.Load(); n++ {
				i := next.Add(1) - 1
				e := entry(fmt.Sprintf("dev-%d", i%4), fmt.Sprintf("p%d-%d", os.Getpid(), i), 1, uint64(i+1))
				if err := ob.Append(context.Background(), e); err != nil {
					say("bad append:", err)
					failed.Store(true)
					return
				}
				say("ok", e.Envelope.ID) // after Append returned: durable
				if n%3 != 2 {
					continue
				}
				if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
					say("bad resolve:", err)
					failed.Store(true)
					return
				}
				say("res", e.Envelope.ID) // after Resolve returned: durable
			}
		})
	}
	wg.Wait()
	ob.Close()
	if failed.Load() {
		return 2
	}
	return 0
}

// TestOutboxKill9ConcurrentAppends kills, at a random moment, a child
// appending from 16 goroutines at once (their appends and resolves share
// commits). After each kill: bbolt's check is clean; every entry the child
// printed as appended is there and every one printed as resolved is
// accepted; each device's positions run 1..n without a gap; and at most
// killWriters entries per round exist beyond the printed ones (the
// appends in flight: one group).
func TestOutboxKill9ConcurrentAppends(t *testing.T) {
	rounds := 12
	path := dbPath(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 21))
	var appended []string
	resolved := map[string]bool{}
	for round := range rounds {
		recs := killAndList(t, path, rng, round, killConcurrentEnv, &appended, resolved)
		byID := make(map[string]offline.Record, len(recs))
		perDev := map[string][]uint64{}
		for _, r := range recs {
			byID[r.ID] = r
			perDev[r.Device] = append(perDev[r.Device], r.Pos)
		}
		for _, id := range appended {
			if rec, ok := byID[id]; !ok || resolved[id] && rec.State != fence.Accepted {
				t.Fatalf("round %d: acknowledged %s (resolved %v) is %+v", round, id, resolved[id], rec)
			}
		}
		if extra := len(recs) - len(appended); extra < 0 || extra > killWriters*(round+1) {
			t.Fatalf("round %d: %d entries, %d acknowledged appends", round, len(recs), len(appended))
		}
		for dev, pos := range perDev {
			for i, p := range pos {
				if p != uint64(i+1) {
					t.Fatalf("round %d: %s positions %v: a gap or reorder", round, dev, pos)
				}
			}
		}
	}
	t.Logf("%d rounds, %d acknowledged appends, %d acknowledged resolves", rounds, len(appended), len(resolved))
}
