package sim

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// Lanes (FleetConfig.Lanes): real devices decide and fsync each on its own
// flash, in parallel; a Fleet serves all of its devices from one bbolt
// file on one disk, and each MQTT client hands its messages over one at a
// time (the PUBACK goes when the handler returns). With one client a
// fleet decides one command per fsync, however many of its devices have
// one waiting. With several lanes (clients), the handlers of different
// lanes hand their commands to one batch loop, which decides what has
// arrived together in one transaction (shim.ProcessBatch) and answers each
// handler once that transaction is committed: every ack, and every
// PUBACK, still follows the fsync of its device's mark (invariant I3).

// maxBatch caps the commands decided in one transaction.
const maxBatch = 256

// dialLanes dials n (at least one) clients with mc; lane i > 0 connects
// as mc.ClientID-i.
func dialLanes(ctx context.Context, mc mqtt.Config, n int) ([]*mqtt.Client, error) {
	id := mc.ClientID
	var clients []*mqtt.Client
	for i := range max(n, 1) {
		if i > 0 {
			mc.ClientID = fmt.Sprintf("%s-%d", id, i)
		}
		c, err := mqtt.Dial(ctx, mc)
		if err != nil {
			for _, c := range clients {
				_ = c.Close(context.Background())
			}
			return nil, err
		}
		clients = append(clients, c)
	}
	return clients, nil
}

// batchCount is the batch loop's HandleAll calls (0 without one).
func (f *Fleet) batchCount() uint64 {
	if f.batches == nil {
		return 0
	}
	return f.batches.batches.Load()
}

// oversize sums the clients' dropped oversize packets.
func (f *Fleet) oversize() uint64 {
	var n uint64
	for _, c := range f.clients {
		n += c.Stats().PacketsOversize
	}
	return n
}

// decide hands one command to the host: directly with one lane, through
// the batch loop with several. It returns once the command's decision is
// committed.
func (f *Fleet) decide(device string, raw []byte) Outcome {
	if f.batches == nil {
		return f.host.Handle(device, raw)
	}
	return f.batches.decide(device, raw)
}

// batchLoop decides the commands its callers hand it in batches, one
// goroutine, owned by the Fleet (stop).
type batchLoop struct {
	host    *Host
	calls   chan *batchCall
	quit    chan struct{}
	done    chan struct{}
	batches atomic.Uint64 // HandleAll calls (FleetStats.Batches)
}

type batchCall struct {
	req  shim.Request
	out  Outcome
	done chan struct{}
}

func startBatchLoop(h *Host) *batchLoop {
	b := &batchLoop{host: h, calls: make(chan *batchCall), quit: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

// decide waits for the batch holding the command to be committed. After
// stop it decides the command alone.
func (b *batchLoop) decide(device string, raw []byte) Outcome {
	c := &batchCall{req: shim.Request{Device: device, Raw: raw}, done: make(chan struct{})}
	select {
	case b.calls <- c:
		<-c.done
		return c.out
	case <-b.quit:
		return b.host.Handle(device, raw)
	}
}

// run takes a call, then every call already waiting (up to maxBatch),
// decides them in one transaction and answers each.
func (b *batchLoop) run() {
	defer close(b.done)
	for {
		var batch []*batchCall
		select {
		case c := <-b.calls:
			batch = append(batch, c)
		case <-b.quit:
			return
		}
	more:
		for len(batch) < maxBatch {
			select {
			case c := <-b.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		reqs := make([]shim.Request, len(batch))
		for i, c := range batch {
			reqs[i] = c.req
		}
		b.batches.Add(1)
		for i, out := range b.host.HandleAll(reqs) {
			batch[i].out = out
			close(batch[i].done)
		}
	}
}

// stop ends the loop (a nil loop does nothing) and waits for it.
func (b *batchLoop) stop() {
	if b == nil {
		return
	}
	select {
	case <-b.quit:
	default:
		close(b.quit)
	}
	<-b.done
}
