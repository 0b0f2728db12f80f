package history_test

import (
	"fmt"

	"github.com/edgefence/edgefence/fence/history"
)

// A frozen holder (token 10) wakes up after token 12 took over, and a
// broken fence point accepts its command.
func ExampleCheck() {
	h := []history.Event{
		{Source: "shim", Op: history.OpVerdict, Device: "dev-1", ID: "a1", Token: 10, Seq: 1, Verdict: "accepted"},
		{Source: "shim", Op: history.OpVerdict, Device: "dev-1", ID: "b1", Token: 12, Seq: 1, Verdict: "accepted"},
		{Source: "shim", Op: history.OpVerdict, Device: "dev-1", ID: "a2", Token: 10, Seq: 2, Verdict: "accepted"},
	}
	r := history.Check(h)
	fmt.Println(r.OK())
	for _, v := range r.Violations {
		fmt.Println(v)
	}
	// Output:
	// false
	// I1 dev-1 a2: stale accept: token 10/2 accepted by shim after token 12/1 (id b1)
}
