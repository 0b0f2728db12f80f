package offline_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/edgefence/edgefence/fence"
)

// Concurrent SetHeld calls share commits (group commit) and each still ends
// durable with the highest token: 16 goroutines, as the agent's campaign
// slots, raise 256 devices' tokens in shuffled order; after a reopen every
// device holds its maximum and no call lowered one.
func TestSetHeldConcurrent(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, nil)
	const devices, raises, workers = 256, 4, 16
	work := make(chan [2]int)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for w := range work {
				if err := ob.SetHeld(fmt.Sprintf("dev-%d", w[0]), fence.Token(w[1])); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Each device's tokens arrive high first, then lower ones: the lower
	// ones must not lower the record.
	for r := raises; r >= 1; r-- {
		for d := range devices {
			work <- [2]int{d, 1000*d + r}
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	ob = open(t, path, nil)
	for d := range devices {
		if got, err := ob.Held(fmt.Sprintf("dev-%d", d)); err != nil || got != fence.Token(1000*d+raises) {
			t.Fatalf("dev-%d after reopen: %d, %v; want %d", d, got, err, 1000*d+raises)
		}
	}
	if err := ob.SetHeld("dev-1", 5); err != nil {
		t.Fatal(err)
	}
	if got, _ := ob.Held("dev-1"); got != 1000+raises {
		t.Fatalf("a lower token lowered the record: %d", got)
	}
	ob.Close()
	if err := ob.SetHeld("dev-1", 1<<40); err == nil {
		t.Fatal("SetHeld after Close: no error")
	}
}

// BenchmarkSetHeldTakeover records the tokens of a takeover of 1,000
// devices by 16 concurrent campaigns (agent.campaignSlots): the time per
// device and the commits it took.
func BenchmarkSetHeldTakeover(b *testing.B) {
	ob := open(b, dbPath(b), nil)
	const devices, workers = 1000, 16
	round := 0
	for b.Loop() {
		round++
		work := make(chan int)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for d := range work {
					if err := ob.SetHeld(fmt.Sprintf("dev-%d", d), fence.Token(round*devices+d)); err != nil {
						b.Error(err)
					}
				}
			})
		}
		for d := range devices {
			work <- d
		}
		close(work)
		wg.Wait()
	}
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/takeover")
	b.ReportMetric(0, "ns/op")
}

// LowerHeld lowers the record durably (the operator's fence reset) and
// never raises it.
func TestLowerHeld(t *testing.T) {
	path := dbPath(t)
	ob := open(t, path, nil)
	if err := ob.SetHeld("d1", 500); err != nil {
		t.Fatal(err)
	}
	if err := ob.LowerHeld("d1", 12); err != nil {
		t.Fatal(err)
	}
	if err := ob.LowerHeld("d1", 40); err != nil { // not a raise
		t.Fatal(err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	ob = open(t, path, nil)
	defer ob.Close()
	if got, err := ob.Held("d1"); err != nil || got != 12 {
		t.Fatalf("held after LowerHeld and a reopen: %d, %v; want 12", got, err)
	}
}
