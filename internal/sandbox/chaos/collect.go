package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgefence/edgefence/fence/history"
	"github.com/edgefence/edgefence/offline"
)

// collect stops every process, reads the histories, completes them from the
// agents' outbox files and checks them.
func (r *round) collect(ctx context.Context) error {
	_ = ctx
	var errs []error
	for _, a := range r.agents {
		if p := a.current(); p != nil {
			if err := p.Stop(15 * time.Second); err != nil && !killedBefore(err) {
				errs = append(errs, fmt.Errorf("%s shutdown: %w", a.name, err))
			}
		}
	}
	r.devsimMu.Lock()
	_ = r.devsim.Stop(10 * time.Second)
	r.devsimMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	paths, err := filepath.Glob(r.path("hist-*.jsonl"))
	if err != nil {
		return err
	}
	events, err := history.Read(paths...)
	if err != nil {
		return err
	}
	for _, a := range r.agents {
		extra, err := outboxEvents(filepath.Join(a.stateDir, offline.File), "outbox-file:"+a.name, events)
		if err != nil {
			return err
		}
		events = append(events, extra...)
	}
	r.res.Sends = int(r.sends.Load())
	r.res.Report = history.Check(events)
	r.res.Events = events
	return nil
}

// killedBefore reports whether err is the exit of a process we had killed
// on purpose (a SIGKILL fault) and that has not been restarted since.
func killedBefore(err error) bool {
	var ee interface{ ExitCode() int }
	return errors.As(err, &ee) && ee.ExitCode() == -1
}

// outboxEvents returns the created and terminal events the agent's outbox
// file proves but the history lacks. The outbox is the durable record of
// creation (I4 is about it); the history line of an event is written just
// after its commit, so a SIGKILL between the two loses the line, not the
// command.
func outboxEvents(path, source string, have []history.Event) ([]history.Event, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, nil
	}
	ob, err := offline.Open(path, &offline.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer ob.Close()
	recs, err := ob.List(offline.Filter{})
	if err != nil {
		return nil, err
	}
	created, terminal := map[string]bool{}, map[string]bool{}
	for _, e := range have {
		switch e.Op {
		case history.OpCreated:
			created[e.ID] = true
		case history.OpTerminal:
			terminal[e.ID] = true
		}
	}
	var out []history.Event
	for _, rec := range recs {
		ev := history.Event{Source: source, Device: rec.Device, ID: rec.ID, Token: uint64(rec.Token), Seq: rec.Seq, Kind: rec.Kind}
		if !created[rec.ID] {
			c := ev
			c.Op, c.Time = history.OpCreated, rec.Created
			out = append(out, c)
		}
		if !rec.Pending() && !terminal[rec.ID] {
			t := ev
			t.Op, t.Time, t.Verdict, t.Reason = history.OpTerminal, rec.Resolved, rec.StateString(), rec.Reason()
			out = append(out, t)
		}
	}
	return out, nil
}
