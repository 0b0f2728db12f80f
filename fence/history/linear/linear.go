// Package linear checks a recorded history for linearizability against a
// fenced register, with github.com/anishathalye/porcupine.
//
// The model is one fence point per device: its state is the high-water mark
// and each command is an operation that runs fence.Admit on it. An
// operation's interval is from its OpCreated event (the agent queued it) to
// its OpTerminal event (the agent recorded its fate); the output is the
// terminal verdict. A history is linearizable when the commands of every
// device can be put in one sequential order, consistent with real time,
// in which the admit rule gives every command its recorded verdict:
//
//   - accepted: Admit accepts it there;
//   - stale: Admit judges it stale there;
//   - duplicate: a redelivery answered after the first delivery's ack was
//     lost, so Admit either accepts it there or judges it a duplicate;
//   - anything else (expired, invalid) or no terminal state at all: the
//     command may or may not have reached the fence point, and if it did
//     it may have been accepted (an Invalid after a failed effect moves the
//     mark too), so both outcomes are allowed and the interval is open.
//
// Intervals come from the events' Time fields, so the histories must come
// from processes that share a clock (one host, as in the tests). This is a
// separate package so that fence points that record histories do not link
// the checker.
package linear

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/history"
)

// Result is porcupine's verdict: porcupine.Ok, porcupine.Illegal, or
// porcupine.Unknown when the timeout struck first.
type Result = porcupine.CheckResult

// ErrNoOperations means the history has no OpCreated events to check.
var ErrNoOperations = errors.New("linear: no created commands in the history")

// input is one command as the register sees it.
type input struct {
	device string
	token  fence.Token
	seq    uint64
}

// Check builds one operation per OpCreated command of events and checks
// the operations for linearizability against the fenced register model,
// giving up after timeout (0: no limit).
func Check(events []history.Event, timeout time.Duration) (Result, error) {
	ops := Operations(events)
	if len(ops) == 0 {
		return porcupine.Unknown, ErrNoOperations
	}
	return porcupine.CheckOperationsTimeout(Model(), ops, timeout), nil
}

// Operations turns a history's commands into porcupine operations: each
// OpCreated event with its first OpTerminal event (same device and id).
// Commands without a terminal state stay pending (Return is the maximum).
// Other events are ignored.
func Operations(events []history.Event) []porcupine.Operation {
	type key struct{ dev, id string }
	idx := map[key]int{}
	var ops []porcupine.Operation
	for _, e := range events {
		k := key{e.Device, e.ID}
		switch e.Op {
		case history.OpCreated:
			if _, dup := idx[k]; dup {
				continue // history.Check reports it
			}
			idx[k] = len(ops)
			ops = append(ops, porcupine.Operation{ClientId: 0,
				Input: input{e.Device, fence.Token(e.Token), e.Seq}, Call: e.Time.UnixNano(),
				Output: "", Return: math.MaxInt64, Metadata: e.ID})
		case history.OpTerminal:
			if i, ok := idx[k]; ok && ops[i].Return == math.MaxInt64 {
				ops[i].Output, ops[i].Return = e.Verdict, e.Time.UnixNano()
				if ops[i].Return < ops[i].Call {
					ops[i].Return = ops[i].Call // clock step back; keep the interval valid
				}
			}
		}
	}
	return ops
}

// Model is the fenced register, partitioned by device.
func Model() porcupine.Model {
	nm := &porcupine.NondeterministicModel{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			byDev := map[string][]porcupine.Operation{}
			var devs []string
			for _, op := range ops {
				d := op.Input.(input).device
				if _, ok := byDev[d]; !ok {
					devs = append(devs, d)
				}
				byDev[d] = append(byDev[d], op)
			}
			slices.Sort(devs)
			out := make([][]porcupine.Operation, 0, len(devs))
			for _, d := range devs {
				out = append(out, byDev[d])
			}
			return out
		},
		Init: func() []any { return []any{fence.Mark{}} },
		Step: func(state, in, out any) []any {
			m, c := state.(fence.Mark), in.(input)
			v, next := fence.Admit(m, c.token, c.seq)
			switch out {
			case fence.Accepted.String():
				if v == fence.Accepted {
					return []any{next}
				}
			case fence.Stale.String():
				if v == fence.Stale {
					return []any{m}
				}
			case fence.Duplicate.String():
				if v == fence.Accepted || v == fence.Duplicate {
					return []any{next}
				}
			default: // unknown fate: reached the fence point or not
				if v == fence.Accepted {
					return []any{m, next}
				}
				return []any{m}
			}
			return nil
		},
		DescribeOperation: func(in, out any) string {
			c := in.(input)
			return fmt.Sprintf("%s %d/%d -> %v", c.device, c.token, c.seq, out)
		},
		DescribeState: func(state any) string { return state.(fence.Mark).String() },
	}
	return nm.ToModel()
}
