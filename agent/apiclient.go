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
	"strconv"
	"strings"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// maxResponseBody bounds an answer of the local API: an outbox list of
// every retained entry.
const maxResponseBody = 256 << 20

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
		return c.dialErr(err)
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

// dialErr is the error of a request that got no answer.
func (c *APIClient) dialErr(err error) error {
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		// Nobody listens there: say so, not "Post http://edgefence/...".
		return fmt.Errorf("%w: %w", ErrUnreachable, op)
	}
	return fmt.Errorf("agent api at %s: %w", c.Socket, err)
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
