package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// mark is an (epoch, token, seq) triple, ordered as fence.AdmitEpoch
// orders them: by epoch, then token, then seq.
type mark struct{ epoch, tok, seq uint64 }

func (a mark) above(b mark) bool {
	if a.epoch != b.epoch {
		return a.epoch > b.epoch
	}
	return a.tok > b.tok || a.tok == b.tok && a.seq > b.seq
}

// markOf is e's (epoch, token, seq).
func markOf(e Event) mark { return mark{e.Epoch, e.Token, e.Seq} }

// note keeps w.pending up to date with an event written under w's source:
// the highest accept per device since the device's last OpOpened event, as
// the checker sees them. Call with w.mu held.
func (w *Writer) note(e Event) {
	if e.Source != w.source || e.Device == "" {
		return
	}
	switch {
	case e.Op == OpVerdict && e.Verdict == verdictAccepted:
		if m := markOf(e); m.above(w.pending[e.Device]) {
			w.pending[e.Device] = m
		}
	case e.Op == OpOpened:
		delete(w.pending, e.Device)
	}
}

// scan notes the events already in the file (a previous run of the same
// source). Lines that do not parse (torn) are skipped: Read's rules.
func (w *Writer) scan() error {
	r := bufio.NewReaderSize(io.NewSectionReader(w.f, 0, 1<<62), 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		var e Event
		if len(line) > 0 && json.Unmarshal(line, &e) == nil {
			w.note(e)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("history: %w", err)
		}
	}
}

// Recover is what a fence point calls when it opens its store, before its
// first decision, and again after a commit failed: it makes the history
// say which of its accepts never became durable.
//
// durable returns the device's durable high-water mark as the store holds
// it now, with the epoch it was accepted in (0, 0, 0 for a device it does
// not know). For every device for which
// this writer's source has recorded an accept above that mark since the
// device's last OpOpened event (in this file, by this or an earlier
// process, or through this Writer), Recover records an OpOpened event
// {Device, Epoch, Token, Seq: the durable mark}: the checker then discards those
// accepts as never committed (see CheckWith). Devices whose accepts are
// all durable get no event, so a history without crashes has none.
//
// The file must be this source's only history, and the source one fence
// point's (one store's) only name. An error from durable skips that device;
// the errors are returned joined.
func (w *Writer) Recover(durable func(device string) (epoch, token, seq uint64, err error)) error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	pending := make(map[string]mark, len(w.pending))
	for d, m := range w.pending {
		pending[d] = m
	}
	w.mu.Unlock()
	var errs []error
	for _, dev := range sortedKeys(pending) {
		epoch, tok, seq, err := durable(dev)
		if err != nil {
			errs = append(errs, fmt.Errorf("history: durable mark of %s: %w", dev, err))
			continue
		}
		hi := pending[dev]
		if !hi.above(mark{epoch, tok, seq}) {
			continue
		}
		err = w.Record(Event{Op: OpOpened, Device: dev, Epoch: epoch, Token: tok, Seq: seq,
			Reason: fmt.Sprintf("durable mark %d/%d in epoch %d: accepts above it (up to %d/%d in epoch %d) were never committed",
				tok, seq, epoch, hi.tok, hi.seq, hi.epoch)})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// uncommitted returns the indices of the accept events that CheckWith
// discards: for a source S and device D, an OpVerdict accepted event of S
// for D whose (epoch, token, seq) is above the (epoch, token, seq) of S's
// next OpOpened event for D. Only accepts since S's previous OpOpened for D
// are judged.
func uncommitted(events []Event) map[int]bool {
	var (
		out     = map[int]bool{}
		pending = map[point][]int{}
	)
	for i, e := range events {
		if e.Device == "" {
			continue
		}
		p := point{e.Device, e.Source}
		switch {
		case e.Op == OpVerdict && e.Verdict == verdictAccepted:
			pending[p] = append(pending[p], i)
		case e.Op == OpOpened:
			m := markOf(e)
			for _, j := range pending[p] {
				if markOf(events[j]).above(m) {
					out[j] = true
				}
			}
			delete(pending, p)
		}
	}
	return out
}
