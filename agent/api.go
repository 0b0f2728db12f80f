package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// The local control API: HTTP over a unix socket, for `edgefence status` and
// `edgefence send` and for local integrations.
//
//	GET  /v1/status                       → Status
//	POST /v1/send {device, kind, body}    → SendResult (body is any JSON value; sent as CBOR)
//	     400 malformed, data after the object, or a body CBOR cannot carry as
//	     written (±Inf, integers beyond 64 bits): refused before a seq is used;
//	     413 over maxRequestBody
//	     {…, "no_wait": true}             → 202 SendResult{queued} once stored in the outbox
//	POST /v1/fanout {devices|glob|selector, kind, body, no_wait} → NDJSON (fanoutapi.go)
//	GET  /v1/fence                        → []fence.Record
//	GET  /v1/fence/{device}               → fence.Record
//	GET  /v1/outbox?device=&state=&limit= → OutboxList (state pending|terminal|all, default all; limit 0 = all)
//	GET  /v1/outbox/{id}                  → offline.Record (id, or a prefix matching one entry)

// SendRequest is the body of POST /v1/send.
type SendRequest struct {
	Device string          `json:"device"`
	Kind   string          `json:"kind"`
	Body   json.RawMessage `json:"body,omitempty"`
	// NoWait returns as soon as the command is stored in the outbox
	// (202, Queued), without waiting for the device's verdict.
	NoWait bool `json:"no_wait,omitempty"`
}

// SendResult is the answer of POST /v1/send.
type SendResult struct {
	Device  string     `json:"device"`
	ID      string     `json:"id,omitempty"`     // the command id (outbox show ID)
	Queued  bool       `json:"queued,omitempty"` // stored in the outbox, no verdict yet
	Token   uint64     `json:"token,omitempty"`
	Seq     uint64     `json:"seq,omitempty"`
	Verdict string     `json:"verdict,omitempty"` // empty when no ack arrived
	Ack     *AckStatus `json:"ack,omitempty"`
	Error   string     `json:"error,omitempty"`
}

// OutboxList is the answer of GET /v1/outbox: the selected records, in
// device and queue order, and the summary of the pending entries (of the
// selected device, if one is).
type OutboxList struct {
	Records []offline.Record `json:"records"`
	Summary offline.Summary  `json:"summary"`
	// Corrupt, if set, says which records were unreadable and left out
	// (offline.ErrCorrupt); the readable ones are in Records.
	Corrupt string `json:"corrupt,omitempty"`
}

const maxRequestBody = 1 << 20

// apiServer is the local API's handlers. It sees the rest of the agent
// through apiHost (the command path and Status), the outbox's read side
// (outboxReader) and the fence table's (FenceTable). It has no lock: its
// only state is the refusal counters, atomics.
type apiServer struct {
	host   apiHost
	outbox outboxReader
	table  FenceTable // nil: the agent keeps no fence table
	log    *slog.Logger

	// refusedN counts requests refused as bad input, by reason
	// (apiRefusals order).
	refusedN [len(apiRefusals)]atomic.Uint64
}

// apiHost is what the local API needs of the agent: the command path and
// a status snapshot (Agent.Send, Agent.Enqueue, Agent.Status).
type apiHost interface {
	Send(ctx context.Context, dev, kind string, body []byte) (*fence.Ack, error)
	Enqueue(ctx context.Context, dev, kind string, body []byte) (*fence.Envelope, error)
	Status() Status
	// The fan-out (fanout.go, fanoutapi.go).
	CheckCommand(kind string, body []byte) error
	SelectDevices(sel Selection) ([]string, error)
	FanOut(ctx context.Context, devs []string, kind string, body []byte, wait bool, report func(SendResult)) FanoutSummary
}

// outboxReader is the read side of offline.Outbox the local API serves.
type outboxReader interface {
	List(f offline.Filter) ([]offline.Record, error)
	Summary(device string) (offline.Summary, error)
	Find(id string) (offline.Record, error)
}

// ServeAPI serves the local API on a unix socket at path until ctx ends: it
// is ListenAPI, then ServeAPIListener.
func (a *Agent) ServeAPI(ctx context.Context, path string) error {
	l, err := ListenAPI(path)
	if err != nil {
		return err
	}
	return a.ServeAPIListener(ctx, l)
}

// ListenAPI claims the API socket at path, creating its directory. A stale
// socket file from an earlier run is replaced; a socket another agent
// serves is an error. A daemon calls it before it connects to anything, so
// that a second agent started on the same config fails before it can
// campaign for the devices or take over the first one's MQTT session.
func ListenAPI(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("api socket dir: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api: listen %s: %w", path, err)
	}
	_ = os.Chmod(path, 0o660)
	return l, nil
}

// ServeAPIListener serves the local API on l (from ListenAPI) until ctx
// ends, then closes l, which removes its socket file.
func (a *Agent) ServeAPIListener(ctx context.Context, l net.Listener) error {
	return a.api.serve(ctx, l)
}

// APIHandler returns the local API's HTTP handler.
func (a *Agent) APIHandler() http.Handler { return a.api.handler() }

// serve is ServeAPIListener.
func (s *apiServer) serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := context.WithCancel(ctx) // stop: Serve failed on its own
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.Serve(l) // closes l
	stop()
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("api: %w", err)
}

// removeStaleSocket removes path if it is a socket nobody listens on, and
// fails if another agent is serving there.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("api socket: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("api socket: %s is in use by a running agent", path)
	}
	return os.Remove(path)
}

// handler returns the local API's HTTP handler.
func (s *apiServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.host.Status())
	})
	mux.HandleFunc("POST /v1/send", s.handleSend)
	mux.HandleFunc("POST /v1/fanout", s.handleFanout)
	mux.HandleFunc("GET /v1/fence", func(w http.ResponseWriter, r *http.Request) {
		if s.table == nil {
			writeJSON(w, http.StatusNotFound, apiError{noFenceTable})
			return
		}
		recs, err := s.table.List()
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, recs)
	})
	mux.HandleFunc("GET /v1/fence/{device}", func(w http.ResponseWriter, r *http.Request) {
		if s.table == nil {
			writeJSON(w, http.StatusNotFound, apiError{noFenceTable})
			return
		}
		rec, ok, err := s.table.Get(r.PathValue("device"))
		switch {
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		case !ok:
			writeJSON(w, http.StatusNotFound, apiError{"no mark for " + r.PathValue("device")})
		default:
			writeJSON(w, http.StatusOK, rec)
		}
	})
	mux.HandleFunc("GET /v1/outbox", s.handleOutboxList)
	mux.HandleFunc("GET /v1/outbox/{id}", s.handleOutboxGet)
	return mux
}

func (s *apiServer) handleOutboxList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := offline.Filter{Device: q.Get("device")}
	switch q.Get("state") {
	case "pending":
		f.PendingOnly = true
	case "terminal":
		f.TerminalOnly = true
	case "all", "":
	default:
		err := fmt.Errorf("state %q: want pending, terminal or all", q.Get("state"))
		s.refused(r, refusedMalformed, err)
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			err := fmt.Errorf("limit %q: want a count, 0 for all", l)
			s.refused(r, refusedMalformed, err)
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		f.Limit = n
	}
	recs, err := s.outbox.List(f)
	var res OutboxList
	switch {
	case errors.Is(err, offline.ErrCorrupt):
		res.Corrupt = err.Error() // with the readable records
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	res.Records = recs
	if res.Records == nil {
		res.Records = []offline.Record{}
	}
	if res.Summary, err = s.outbox.Summary(f.Device); err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *apiServer) handleOutboxGet(w http.ResponseWriter, r *http.Request) {
	rec, err := s.outbox.Find(r.PathValue("id"))
	switch {
	case errors.Is(err, offline.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
	case errors.Is(err, offline.ErrAmbiguous):
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
	default:
		writeJSON(w, http.StatusOK, rec)
	}
}

func (s *apiServer) handleSend(w http.ResponseWriter, r *http.Request) {
	var req SendRequest
	if !s.decode(w, r, &req, func(err error) any { return SendResult{Device: req.Device, Error: err.Error()} }) {
		return
	}
	// The body is converted, and refused if CBOR cannot carry it as
	// written, before a command is issued: a refusal uses up no seq.
	body, err := JSONToBody(req.Body)
	if err != nil {
		s.refused(r, refusedBody, err)
		writeJSON(w, http.StatusBadRequest, SendResult{Device: req.Device, Error: err.Error()})
		return
	}
	res := SendResult{Device: req.Device}
	if req.NoWait {
		env, err := s.host.Enqueue(r.Context(), req.Device, req.Kind, body)
		if err == nil {
			res.ID, res.Token, res.Seq, res.Queued = env.ID, uint64(env.Token), env.Seq, true
			writeJSON(w, http.StatusAccepted, res)
			return
		}
		s.writeSendError(w, r, res, err)
		return
	}
	ack, err := s.host.Send(r.Context(), req.Device, req.Kind, body)
	if ack != nil {
		res.ID, res.Token, res.Seq, res.Verdict, res.Ack = ack.ID, uint64(ack.Token), ack.Seq, ack.Verdict.String(), NewAckStatus(ack)
		writeJSON(w, http.StatusOK, res) // a verdict, even stale, is an answer
		return
	}
	var qe *QueuedError
	if errors.As(err, &qe) {
		res.ID, res.Token, res.Seq, res.Queued = qe.ID, uint64(qe.Token), qe.Seq, true
	}
	s.writeSendError(w, r, res, err)
}

// decodeRequest decodes r's body, one JSON object of at most
// maxRequestBody bytes with nothing after it, into v. On failure it
// returns the status to answer: 413 for a body over the limit (naming it),
// 400 for anything else.
func decodeRequest(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// A second value, or garbage, after the object: the request is
		// not what its sender meant, so nothing of it is executed.
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errTrailingData
			if terr != nil && !errors.As(terr, new(*json.SyntaxError)) {
				err = terr
			}
		}
	}
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("request too large: the API takes at most %d MiB (%d bytes) a request; a command body is at most %d KiB as CBOR",
			tooLarge.Limit>>20, tooLarge.Limit, fence.MaxBodySize>>10)
	}
	if err != nil {
		return http.StatusBadRequest, fmt.Errorf("bad request: %w", err)
	}
	return http.StatusOK, nil
}

// decode is decodeRequest for a handler: a request it cannot decode is
// counted, logged and answered with answer(err); it reports whether the
// handler goes on.
func (s *apiServer) decode(w http.ResponseWriter, r *http.Request, v any, answer func(error) any) bool {
	code, err := decodeRequest(w, r, v)
	if err == nil {
		return true
	}
	why := refusedMalformed
	if code == http.StatusRequestEntityTooLarge {
		why = refusedTooLarge
	}
	s.refused(r, why, err)
	writeJSON(w, code, answer(err))
	return false
}

var errTrailingData = errors.New("data after the JSON object")

// Why the local API refused a request as bad input: the reason label of
// edgefence_api_requests_refused_total, indexes of apiServer.refusedN.
var apiRefusals = [...]string{"too_large", "malformed", "bad_body", "unknown_device", "bad_selection"}

const (
	refusedTooLarge = iota
	refusedMalformed
	refusedBody
	refusedUnknownDevice
	refusedSelection
)

// refused counts and logs a request refused as bad input; the caller
// answers it.
func (s *apiServer) refused(r *http.Request, why int, err error) {
	s.refusedN[why].Add(1)
	s.log.Warn("api request refused", "method", r.Method, "path", r.URL.Path, "reason", apiRefusals[why], "err", err)
}

// writeSendError answers a send that got no verdict.
func (s *apiServer) writeSendError(w http.ResponseWriter, r *http.Request, res SendResult, err error) {
	res.Error = err.Error()
	code := http.StatusBadGateway
	switch {
	case errors.Is(err, ErrUnknownDevice):
		code = http.StatusNotFound
		s.refused(r, refusedUnknownDevice, err)
	case errors.Is(err, ErrNotHolder):
		code = http.StatusConflict
	case errors.Is(err, fence.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, ErrNoAck):
		code = http.StatusGatewayTimeout // queued in the outbox: resent until the device answers
	case errors.Is(err, offline.ErrFull):
		code = http.StatusServiceUnavailable // backpressure: try again later
	}
	writeJSON(w, code, res)
}

// writeJSON answers v as compact JSON, one line. Clients decode it (the
// CLI prints its own output); a person reading the socket with curl can
// pipe it through jq. Indenting cost every command (issue 17).
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type apiError struct {
	Error string `json:"error"`
}

// noFenceTable is the API's answer (404) when the agent has no table.
const noFenceTable = "this agent keeps no fence table: its gateway is home of no `fence: gateway` device"

// refusedCounts returns the refusal counters, by reason (apiRefusals order).
func (s *apiServer) refusedCounts() (n [len(apiRefusals)]uint64) {
	for i := range s.refusedN {
		n[i] = s.refusedN[i].Load()
	}
	return n
}
