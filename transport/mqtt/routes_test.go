package mqtt

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The indexed delivery finds exactly the subscriptions a scan of every
// filter with matchFilter finds, in registration order, for exact,
// wildcard, shared and $-topics alike, with repeats and overlaps.
func TestHandlersForMatchesScan(t *testing.T) {
	filters := []string{"a/b", "a/+", "a/#", "#", "+/+", "+", "a/b/c", "$share/g/a/b", "$share/g/a/+",
		"$SYS/x", "$SYS/#", "+/x", "a/b", "ef/v1/dev/d1/ack", "ef/v1/dev/d2/ack", "ef/v1/dev/+/state", "ef/v1/dev/d1/state", "/", "a/"}
	topics := []string{"a/b", "a/c", "a", "a/b/c", "$SYS/x", "b/x", "ef/v1/dev/d1/ack", "ef/v1/dev/d2/ack",
		"ef/v1/dev/d3/ack", "ef/v1/dev/d1/state", "/", "a/", "", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		c := &Client{}
		var got []int
		n := 1 + rng.IntN(3*len(filters))
		for i := range n {
			f := filters[rng.IntN(len(filters))]
			c.addSubLocked(f, func(Message) { got = append(got, i) })
		}
		for _, topic := range topics {
			var want []int
			for i, s := range c.subs {
				if matchFilter(s.filter, topic) {
					want = append(want, i)
				}
			}
			got = got[:0]
			for _, h := range c.handlersFor(topic) {
				h(Message{Topic: topic})
			}
			if !slices.Equal(got, want) {
				t.Fatalf("round %d, topic %q: handlers %v, want %v (filters %v)", round, topic, got, want, c.subs)
			}
		}
	}
}

// BenchmarkHandlersFor routes one ack among an agent's per-device ack
// filters and its one state wildcard.
func BenchmarkHandlersFor(b *testing.B) {
	for _, devices := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprint(devices), func(b *testing.B) {
			c := &Client{}
			for i := range devices {
				c.addSubLocked(fmt.Sprintf("edgefence/v1/dev/d%d/ack", i), func(Message) {})
			}
			c.addSubLocked("edgefence/v1/dev/+/state", func(Message) {})
			topic := fmt.Sprintf("edgefence/v1/dev/d%d/ack", devices/2)
			for b.Loop() {
				if len(c.handlersFor(topic)) != 1 {
					b.Fatal("no handler")
				}
			}
		})
	}
}
