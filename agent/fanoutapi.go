package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// POST /v1/fanout: one command to many devices (fanout.go).
//
//	{"devices": [ids] | "glob": "meter-*" | "selector": "site=a,kind!=pump",
//	 "kind": K, "body": any JSON value, "no_wait": bool}
//	→ 200, application/x-ndjson, one FanoutEvent a line, flushed as they come:
//	  {"selected": {"devices": N}}            first
//	  {"result": SendResult}                   one per device, as its outcome is known
//	  {"summary": FanoutSummary}               last
//	  400 before any line: a malformed request, a bad selection (none or
//	  several of devices/glob/selector, a bad glob or selector, no device
//	  selected, more than MaxFanoutDevices), a body CBOR cannot carry or a
//	  command no device could take (kind, body over fence.MaxBodySize);
//	  413 over maxRequestBody.
//
// A device the agent cannot command (unknown, not held, queue full) is a
// result with an error and no verdict (outcome refused), not a failed
// request.

// FanoutRequest is the body of POST /v1/fanout.
type FanoutRequest struct {
	Selection
	Kind   string          `json:"kind"`
	Body   json.RawMessage `json:"body,omitempty"`
	NoWait bool            `json:"no_wait,omitempty"` // report each device queued once stored
}

// FanoutEvent is one line of POST /v1/fanout's answer: exactly one field
// is set.
type FanoutEvent struct {
	Selected *FanoutSelected `json:"selected,omitempty"`
	Result   *SendResult     `json:"result,omitempty"`
	Summary  *FanoutSummary  `json:"summary,omitempty"`
}

// FanoutSelected is the first line: how many devices the request selects.
type FanoutSelected struct {
	Devices int `json:"devices"`
}

// fanoutFlushEvery bounds how long a result line waits in the response
// buffer: lines are flushed at most this often (one write per line would
// cost a syscall per device).
const fanoutFlushEvery = 50 * time.Millisecond

func (s *apiServer) handleFanout(w http.ResponseWriter, r *http.Request) {
	var req FanoutRequest
	if !s.decode(w, r, &req, func(err error) any { return apiError{err.Error()} }) {
		return
	}
	body, err := JSONToBody(req.Body)
	if err == nil {
		err = s.host.CheckCommand(req.Kind, body)
	}
	if err != nil {
		s.refused(r, refusedBody, err)
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	devs, err := s.host.SelectDevices(req.Selection)
	if err != nil {
		s.refused(r, refusedSelection, err)
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	_ = enc.Encode(FanoutEvent{Selected: &FanoutSelected{Devices: len(devs)}})
	_ = rc.Flush()
	last := time.Now()
	sum := s.host.FanOut(r.Context(), devs, req.Kind, body, !req.NoWait, func(res SendResult) {
		_ = enc.Encode(FanoutEvent{Result: &res})
		if now := time.Now(); now.Sub(last) >= fanoutFlushEvery {
			_ = rc.Flush()
			last = now
		}
	})
	_ = enc.Encode(FanoutEvent{Summary: &sum})
	_ = rc.Flush()
}

// CheckCommand checks, once for a whole fan-out, what every device's
// envelope would be refused for whatever the device: the kind and the
// body's size (fence.Envelope.Validate). The error wraps fence.ErrInvalid.
func (a *Agent) CheckCommand(kind string, body []byte) error {
	probe := fence.Envelope{V: fence.Version, Device: "probe", Token: 1, Seq: 1, ID: "probe", Kind: kind, Body: body, IssuedAt: 1, Holder: a.cfg.Gateway}
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("command refused before any device: %w", err)
	}
	return nil
}

// errNoSummary is the client's error when the answer ended before its
// summary line (the agent stopped, or the connection broke).
var errNoSummary = errors.New("agent api: fan-out answer ended before its summary")

// FanOut asks the agent to command the devices req selects and calls each
// for every line of the answer as it arrives (the selected count, then one
// result a device). It returns the summary. A refused request is an error
// carrying the agent's reason; an answer cut short (the agent was killed)
// is an error wrapping errNoSummary, after the lines that did arrive.
func (c *APIClient) FanOut(ctx context.Context, req FanoutRequest, each func(FanoutEvent)) (*FanoutSummary, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://edgefence/v1/fanout", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, c.dialErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e apiError
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxRequestBody))
		if json.Unmarshal(raw, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("%w: %s: %s", errAPIStatus(resp.StatusCode), resp.Status, e.Error)
		}
		return nil, fmt.Errorf("%w: %s", errAPIStatus(resp.StatusCode), resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxRequestBody)
	for sc.Scan() {
		var ev FanoutEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("agent api: fan-out line: %w", err)
		}
		if ev.Summary != nil {
			return ev.Summary, nil
		}
		each(ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoSummary, err)
	}
	return nil, errNoSummary
}
