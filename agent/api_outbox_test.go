package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/offline"
)

// serveAPI serves a's local API on a real unix socket until the test ends
// and returns a client for it.
func serveAPI(t *testing.T, a *Agent) *APIClient {
	t.Helper()
	dir, err := os.MkdirTemp("", "api-") // t.TempDir can exceed a socket path's 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	l, err := ListenAPI(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.ServeAPIListener(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeAPIListener: %v", err)
		}
	})
	return NewAPIClient(sock)
}

// newAPIAgent builds (does not run) an agent with o, for API tests.
func newAPIAgent(t *testing.T, o Options) *Agent {
	t.Helper()
	cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/api-test", LeaseTTL: 2 * time.Second},
		MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 5 * time.Second},
		Devices: []DeviceConfig{{ID: "dev-a", Auth: AuthOff}, {ID: "dev-b", Auth: AuthOff}}}
	a, err := newAgent(t, cfg, etcdClient(t), newFencePoint(), o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// outboxWith returns an outbox at path holding, for dev-a, a1 (accepted),
// a2 and a3 (pending), and for dev-b, b1 (stale) and b2 (pending), created
// a second apart.
// bigBody is a1000001's body in outboxWith: over offline.KeepBodyMax.
var bigBody = append([]byte{0x59, 0x07, 0xd0}, make([]byte, 2000)...)

func outboxWith(t *testing.T, path string, now func() time.Time) *offline.Outbox {
	t.Helper()
	ob, err := offline.Open(path, &offline.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	start := now()
	for i, c := range []struct {
		dev, id string
		seq     uint64
		v       fence.Verdict
	}{
		{"dev-a", "a1000001", 1, fence.Accepted},
		{"dev-a", "a2000002", 2, 0},
		{"dev-a", "a3000003", 3, 0},
		{"dev-b", "b1000001", 1, fence.Stale},
		{"dev-b", "b2000002", 2, 0},
	} {
		e := &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: c.dev, Token: 7, Seq: c.seq, ID: c.id, Kind: "set"},
			Created: start.Add(time.Duration(i) * time.Second)}
		switch c.id {
		case "a1000001": // dropped once accepted
			e.Envelope.Body = bigBody
		case "a2000002":
			e.Envelope.Body = []byte{0x42, 'o', 'n'}
		}
		if err := ob.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		if c.v != 0 {
			ack := fence.NewAck(&e.Envelope, c.v, fence.Mark{Token: 9, Seq: 1}, "reason of "+c.id)
			if err := ob.Resolve(c.id, &ack); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ob
}

func TestAPIOutbox(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	clock := func() time.Time { return now }
	ob := outboxWith(t, filepath.Join(t.TempDir(), offline.File), clock)
	now = now.Add(time.Minute)
	c := serveAPI(t, newAPIAgent(t, Options{Outbox: ob}))
	ctx := context.Background()

	ids := func(l *OutboxList) string {
		var s []string
		for _, r := range l.Records {
			s = append(s, r.ID)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		f    offline.Filter
		want string
	}{
		{offline.Filter{}, "a1000001 a2000002 a3000003 b1000001 b2000002"},
		{offline.Filter{PendingOnly: true}, "a2000002 a3000003 b2000002"},
		{offline.Filter{TerminalOnly: true}, "a1000001 b1000001"},
		{offline.Filter{Device: "dev-b"}, "b1000001 b2000002"},
		{offline.Filter{PendingOnly: true, Limit: 2}, "a2000002 a3000003"},
		{offline.Filter{Device: "nope"}, ""},
		{offline.Filter{PendingOnly: true, TerminalOnly: true}, ""},
	} {
		l, err := c.OutboxList(ctx, tc.f)
		if err != nil {
			t.Fatalf("%+v: %v", tc.f, err)
		}
		if got := ids(l); got != tc.want {
			t.Errorf("OutboxList(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}

	l, err := c.OutboxList(ctx, offline.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	s := l.Summary
	// The heads: a2, created 1s after the first entry, and b2, 4s after.
	if s.Pending != 3 || len(s.Devices) != 2 || s.Devices[0].Pending != 2 || s.Devices[1].Pending != 1 ||
		s.OldestAge != 59*time.Second || s.Devices[1].OldestAge != 56*time.Second || s.ReadOnly {
		t.Errorf("summary %+v", s)
	}
	if n, b := ob.Pending("dev-a"); s.Devices[0].Bytes != b || n != 2 {
		t.Errorf("summary bytes %d, outbox %d", s.Devices[0].Bytes, b)
	}
	if r := l.Records[3]; r.State != fence.Stale || r.Reason() != "reason of b1000001" || r.Ack == nil ||
		r.Ack.MaxToken != 9 || r.Token != 7 || r.Seq != 1 || r.Kind != "set" || r.Age != 57*time.Second {
		t.Errorf("record %+v ack %+v", r, r.Ack)
	}
	if l, err := c.OutboxList(ctx, offline.Filter{Device: "dev-b"}); err != nil || l.Summary.Pending != 1 || len(l.Summary.Devices) != 1 {
		t.Errorf("summary of dev-b: %+v %v", l, err)
	}

	for _, tc := range []struct {
		id, want string
		err      error
	}{
		{"a2000002", "a2000002", nil},
		{"b1", "b1000001", nil},
		{"a", "", offline.ErrAmbiguous},
		{"zz", "", offline.ErrNotFound},
	} {
		r, err := c.OutboxGet(ctx, tc.id)
		if !errors.Is(err, tc.err) || r.ID != tc.want {
			t.Errorf("OutboxGet(%q) = %q, %v; want %q, %v", tc.id, r.ID, err, tc.want, tc.err)
		}
	}
	if r, err := c.OutboxGet(ctx, "a1000001"); err != nil || r.State != fence.Accepted || r.Ack == nil || r.Resolved.IsZero() {
		t.Errorf("OutboxGet: %+v %v", r, err)
	}
	// Bodies: a1's dropped once accepted, its size and SHA-256 kept; a2's pending.
	sum := sha256.Sum256(bigBody)
	if r, err := c.OutboxGet(ctx, "a1000001"); err != nil || r.BodyBytes != len(bigBody) || !r.BodyDropped || !bytes.Equal(r.BodySHA256, sum[:]) {
		t.Errorf("OutboxGet of a dropped body: %d bytes, dropped %v, sha256 %x, %v", r.BodyBytes, r.BodyDropped, r.BodySHA256, err)
	}
	if r, err := c.OutboxGet(ctx, "a2000002"); err != nil || r.BodyBytes != 3 || r.BodyDropped || r.BodySHA256 != nil {
		t.Errorf("OutboxGet of a pending body: %+v %v", r, err)
	}

	// Bad queries: 400 with the reason.
	for _, q := range []string{"state=done", "limit=-1", "limit=ten"} {
		code, body := rawGet(t, c.Socket, "/v1/outbox?"+q)
		if code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s", q, code, body)
		}
	}
}

// Unreadable records: the readable ones are served, the error names the
// bad one and wraps offline.ErrCorrupt.
func TestAPIOutboxCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), offline.File)
	outboxWith(t, path, time.Now).Close()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("outbox.entries")).Put([]byte("a3000003"), []byte("garbage"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	ob, err := offline.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	c := serveAPI(t, newAPIAgent(t, Options{Outbox: ob}))
	l, err := c.OutboxList(context.Background(), offline.Filter{})
	if !errors.Is(err, offline.ErrCorrupt) || !strings.Contains(err.Error(), "a3000003") || l == nil || len(l.Records) != 4 {
		t.Fatalf("OutboxList: %+v %v", l, err)
	}
	if _, err := c.OutboxGet(context.Background(), "a3000003"); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("OutboxGet of the bad record: %v", err)
	}
}

// rawGet sends a GET the client would never send.
func rawGet(t *testing.T, socket, path string) (int, string) {
	t.Helper()
	return rawDo(t, socket, http.MethodGet, path, nil)
}

// rawDo sends a request straight to the API socket and returns the status
// and body of the answer.
func rawDo(t *testing.T, socket, method, path string, body io.Reader) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://edgefence"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(fmt.Errorf("read: %w", err))
	}
	return resp.StatusCode, string(b)
}
