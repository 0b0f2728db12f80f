package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

const (
	maxRequestBody  = 1 << 20
	maxResponseBody = 256 << 20 // an outbox list of every retained entry
)

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
	srv := &http.Server{Handler: a.APIHandler(), ReadHeaderTimeout: 5 * time.Second}
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

// APIHandler returns the local API's HTTP handler.
func (a *Agent) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status())
	})
	mux.HandleFunc("POST /v1/send", a.handleSend)
	mux.HandleFunc("GET /v1/fence", func(w http.ResponseWriter, r *http.Request) {
		if a.table == nil {
			writeJSON(w, http.StatusNotFound, apiError{noFenceTable})
			return
		}
		recs, err := a.table.List()
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, recs)
	})
	mux.HandleFunc("GET /v1/fence/{device}", func(w http.ResponseWriter, r *http.Request) {
		if a.table == nil {
			writeJSON(w, http.StatusNotFound, apiError{noFenceTable})
			return
		}
		rec, ok, err := a.table.Get(r.PathValue("device"))
		switch {
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		case !ok:
			writeJSON(w, http.StatusNotFound, apiError{"no mark for " + r.PathValue("device")})
		default:
			writeJSON(w, http.StatusOK, rec)
		}
	})
	mux.HandleFunc("GET /v1/outbox", a.handleOutboxList)
	mux.HandleFunc("GET /v1/outbox/{id}", a.handleOutboxGet)
	return mux
}

func (a *Agent) handleOutboxList(w http.ResponseWriter, r *http.Request) {
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
		a.refused(r, refusedMalformed, err)
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			err := fmt.Errorf("limit %q: want a count, 0 for all", l)
			a.refused(r, refusedMalformed, err)
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		f.Limit = n
	}
	recs, err := a.outbox.List(f)
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
	if res.Summary, err = a.outbox.Summary(f.Device); err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *Agent) handleOutboxGet(w http.ResponseWriter, r *http.Request) {
	rec, err := a.outbox.Find(r.PathValue("id"))
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

func (a *Agent) handleSend(w http.ResponseWriter, r *http.Request) {
	var req SendRequest
	if code, err := decodeRequest(w, r, &req); err != nil {
		why := refusedMalformed
		if code == http.StatusRequestEntityTooLarge {
			why = refusedTooLarge
		}
		a.refused(r, why, err)
		writeJSON(w, code, SendResult{Device: req.Device, Error: err.Error()})
		return
	}
	// The body is converted, and refused if CBOR cannot carry it as
	// written, before a command is issued: a refusal uses up no seq.
	body, err := JSONToBody(req.Body)
	if err != nil {
		a.refused(r, refusedBody, err)
		writeJSON(w, http.StatusBadRequest, SendResult{Device: req.Device, Error: err.Error()})
		return
	}
	res := SendResult{Device: req.Device}
	if req.NoWait {
		env, err := a.Enqueue(r.Context(), req.Device, req.Kind, body)
		if err == nil {
			res.ID, res.Token, res.Seq, res.Queued = env.ID, uint64(env.Token), env.Seq, true
			writeJSON(w, http.StatusAccepted, res)
			return
		}
		a.writeSendError(w, r, res, err)
		return
	}
	ack, err := a.Send(r.Context(), req.Device, req.Kind, body)
	if ack != nil {
		res.ID, res.Token, res.Seq, res.Verdict, res.Ack = ack.ID, uint64(ack.Token), ack.Seq, ack.Verdict.String(), NewAckStatus(ack)
		writeJSON(w, http.StatusOK, res) // a verdict, even stale, is an answer
		return
	}
	var qe *QueuedError
	if errors.As(err, &qe) {
		res.ID, res.Token, res.Seq, res.Queued = qe.ID, uint64(qe.Token), qe.Seq, true
	}
	a.writeSendError(w, r, res, err)
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

var errTrailingData = errors.New("data after the JSON object")

// Why the local API refused a request as bad input: the reason label of
// edgefence_api_requests_refused_total, indexes of counters.apiRefused.
var apiRefusals = [...]string{"too_large", "malformed", "bad_body", "unknown_device"}

const (
	refusedTooLarge = iota
	refusedMalformed
	refusedBody
	refusedUnknownDevice
)

// refused counts and logs a request refused as bad input; the caller
// answers it.
func (a *Agent) refused(r *http.Request, why int, err error) {
	a.stats.apiRefused[why].Add(1)
	a.log.Warn("api request refused", "method", r.Method, "path", r.URL.Path, "reason", apiRefusals[why], "err", err)
}

// writeSendError answers a send that got no verdict.
func (a *Agent) writeSendError(w http.ResponseWriter, r *http.Request, res SendResult, err error) {
	res.Error = err.Error()
	code := http.StatusBadGateway
	switch {
	case errors.Is(err, ErrUnknownDevice):
		code = http.StatusNotFound
		a.refused(r, refusedUnknownDevice, err)
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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

type apiError struct {
	Error string `json:"error"`
}

// APIClient talks to a running agent's local API.
type APIClient struct {
	Socket string
	http   *http.Client
}

// NewAPIClient returns a client for the agent listening on socket.
func NewAPIClient(socket string) *APIClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &APIClient{Socket: socket, http: &http.Client{Transport: tr}}
}

// Status fetches the agent's status.
func (c *APIClient) Status(ctx context.Context) (*Status, error) {
	var s Status
	if err := c.do(ctx, http.MethodGet, "/v1/status", nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Send asks the agent to issue a command and returns the device's verdict.
// A non-nil SendResult is returned whenever the agent answered.
func (c *APIClient) Send(ctx context.Context, device, kind string, body json.RawMessage) (*SendResult, error) {
	var res SendResult
	err := c.do(ctx, http.MethodPost, "/v1/send", SendRequest{Device: device, Kind: kind, Body: body}, &res)
	if err != nil && res.Device == "" && res.Error == "" {
		return nil, err
	}
	return &res, err
}

// Enqueue asks the agent to store a command in its outbox and returns at
// once (SendResult.Queued), without the device's verdict.
func (c *APIClient) Enqueue(ctx context.Context, device, kind string, body json.RawMessage) (*SendResult, error) {
	var res SendResult
	err := c.do(ctx, http.MethodPost, "/v1/send", SendRequest{Device: device, Kind: kind, Body: body, NoWait: true}, &res)
	if err != nil && res.Device == "" && res.Error == "" {
		return nil, err
	}
	return &res, err
}

// noFenceTable is the API's answer (404) when the agent has no table.
const noFenceTable = "this agent keeps no fence table: its gateway is home of no `fence: gateway` device"

// FenceList returns the agent's fence table records. An agent that keeps
// no table answers an error wrapping ErrNoFenceTable.
func (c *APIClient) FenceList(ctx context.Context) ([]fence.Record, error) {
	var recs []fence.Record
	if err := c.do(ctx, http.MethodGet, "/v1/fence", nil, &recs); err != nil {
		return nil, noTable(err)
	}
	return recs, nil
}

// FenceGet returns one device's fence table record; found is false if the
// table has no mark for it. An agent that keeps no table answers an error
// wrapping ErrNoFenceTable.
func (c *APIClient) FenceGet(ctx context.Context, device string) (rec fence.Record, found bool, err error) {
	err = c.do(ctx, http.MethodGet, "/v1/fence/"+url.PathEscape(device), nil, &rec)
	if errors.Is(err, ErrNotFound) && strings.Contains(err.Error(), "no mark for") {
		return fence.Record{}, false, nil
	}
	return rec, err == nil, noTable(err)
}

// noTable wraps ErrNoFenceTable around the API's answer that there is no
// fence table.
func noTable(err error) error {
	if errors.Is(err, ErrNotFound) && strings.Contains(err.Error(), "keeps no fence table") {
		return fmt.Errorf("%w: %w", ErrNoFenceTable, err)
	}
	return err
}

// OutboxList returns the agent's outbox records selected by f, and the
// summary of its pending entries. Records the agent could not read are
// left out and reported in an error wrapping offline.ErrCorrupt, returned
// with the list. An agent without an outbox answers ErrNotFound.
func (c *APIClient) OutboxList(ctx context.Context, f offline.Filter) (*OutboxList, error) {
	q := url.Values{}
	if f.Device != "" {
		q.Set("device", f.Device)
	}
	switch {
	case f.PendingOnly && f.TerminalOnly:
		return &OutboxList{Records: []offline.Record{}}, nil // selects nothing
	case f.PendingOnly:
		q.Set("state", "pending")
	case f.TerminalOnly:
		q.Set("state", "terminal")
	default:
		q.Set("state", "all")
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var l OutboxList
	if err := c.do(ctx, http.MethodGet, "/v1/outbox?"+q.Encode(), nil, &l); err != nil {
		return nil, err
	}
	if l.Corrupt != "" {
		return &l, &remoteError{msg: "agent: " + l.Corrupt, is: offline.ErrCorrupt}
	}
	return &l, nil
}

// OutboxGet returns the agent's outbox record of command id (or of the one
// entry whose id starts with id). No such entry is an error wrapping
// offline.ErrNotFound, a prefix matching several offline.ErrAmbiguous
// (both also wrap ErrNotFound or the API's error); an agent without an
// outbox answers ErrNotFound only.
func (c *APIClient) OutboxGet(ctx context.Context, id string) (offline.Record, error) {
	var rec offline.Record
	err := c.do(ctx, http.MethodGet, "/v1/outbox/"+url.PathEscape(id), nil, &rec)
	switch {
	case err == nil:
		return rec, nil
	case strings.Contains(err.Error(), offline.ErrNotFound.Error()):
		return offline.Record{}, &remoteError{msg: err.Error(), is: offline.ErrNotFound, err: err}
	case strings.Contains(err.Error(), offline.ErrAmbiguous.Error()):
		return offline.Record{}, &remoteError{msg: err.Error(), is: offline.ErrAmbiguous, err: err}
	}
	return offline.Record{}, err
}

// remoteError is an error the agent reported, as the sentinel it stands
// for: errors.Is(err, is) holds, and its message is the agent's.
type remoteError struct {
	msg string
	is  error
	err error // the API call's error, if any
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() []error {
	if e.err == nil {
		return []error{e.is}
	}
	return []error{e.is, e.err}
}

func (c *APIClient) do(ctx context.Context, method, path string, in, out any) error {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://edgefence"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
			// Nobody listens there: say so, not "Post http://edgefence/...".
			return fmt.Errorf("%w: %w", ErrUnreachable, op)
		}
		return fmt.Errorf("agent api at %s: %w", c.Socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return fmt.Errorf("agent api: %w", err)
	}
	if len(b) > maxResponseBody {
		return fmt.Errorf("%w: answer to %s larger than %d MiB", errAPI, path, maxResponseBody>>20)
	}
	if resp.StatusCode != http.StatusOK {
		_ = json.Unmarshal(b, out) // e.g. a SendResult carrying the error
		var e apiError
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return fmt.Errorf("%w: %s: %s", errAPIStatus(resp.StatusCode), resp.Status, e.Error)
		}
		return fmt.Errorf("%w: %s", errAPIStatus(resp.StatusCode), resp.Status)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("agent api: %s: %w", resp.Status, err)
	}
	return nil
}

// ErrNotFound means the agent API answered 404.
var ErrNotFound = errors.New("agent api: not found")

var errAPI = errors.New("agent api")

func errAPIStatus(code int) error {
	if code == http.StatusNotFound {
		return ErrNotFound
	}
	return errAPI
}
