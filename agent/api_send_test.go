package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The local API refuses a request with data after its JSON object, a
// {"setpoint": 1e999} that would be sent as +Inf, and a 10 MB request (not
// cut at 1 MiB with "unexpected EOF"): 400, or 413 naming the limit, before
// a command is issued (no seq is used: the next good command is seq 1),
// with a log line and a counter.
func TestAPISendRefusesBadInput(t *testing.T) {
	fp := newFencePoint()
	logs := &logBuffer{}
	a := startAgent(t, "gw-1", "/t/"+t.Name(), []string{"dev-a"}, fp, Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	waitFor(t, "dev-a held", holdingAll(a, []string{"dev-a"}))
	c := serveAPI(t, a.Agent)

	const good = `{"device":"dev-a","kind":"set","body":{"setpoint":21}}`
	for _, tc := range []struct {
		name, req string
		code      int
		want      string
	}{
		{"garbage after the object", good + "garbage", http.StatusBadRequest, "data after the JSON object"},
		{"a second object", good + good, http.StatusBadRequest, "data after the JSON object"},
		{"infinite setpoint", `{"device":"dev-a","kind":"set","body":{"setpoint":1e999}}`, http.StatusBadRequest, `"setpoint": 1e999 is beyond a 64-bit float (it would be sent as +Inf)`},
		{"negative infinity in an array", `{"device":"dev-a","kind":"set","body":{"n":[1,-1e400]}}`, http.StatusBadRequest, `"n[1]": -1e400 is beyond`},
		{"integer beyond 64 bits", `{"device":"dev-a","kind":"set","body":{"a":{"count":18446744073709551616}}}`, http.StatusBadRequest, `"a.count": integer 18446744073709551616 does not fit in 64 bits`},
		{"non-zero rounding to 0", `{"device":"dev-a","kind":"set","body":{"x":1e-400}}`, http.StatusBadRequest, `"x": 1e-400 is too small`},
		{"10 MB", `{"device":"dev-a","kind":"set","body":"` + strings.Repeat("x", 10<<20) + `"}`, http.StatusRequestEntityTooLarge, "at most 1 MiB (1048576 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawDo(t, c.Socket, http.MethodPost, "/v1/send", strings.NewReader(tc.req))
			var res SendResult
			if err := json.Unmarshal([]byte(body), &res); err != nil || code != tc.code || !strings.Contains(res.Error, tc.want) {
				t.Fatalf("%d %s\nwant %d and %q", code, body, tc.code, tc.want)
			}
		})
	}
	fp.mu.Lock()
	applied := len(fp.applied["dev-a"])
	fp.mu.Unlock()
	if applied != 0 {
		t.Fatalf("%d refused requests reached the device", applied)
	}
	res, err := c.Send(context.Background(), "dev-a", "set", []byte(`{"setpoint": 21.5, "big": 18446744073709551615, "neg": -9223372036854775808, "tiny": 5e-324}`))
	if err != nil || res.Verdict != "accepted" || res.Seq != 1 {
		t.Fatalf("good send after the refusals: %+v, %v; want accepted with seq 1 (refusals use no seq)", res, err)
	}
	// Answers are compact JSON, one line (the CLI decodes them and prints
	// its own; indenting cost every command, issue 17).
	if code, body := rawDo(t, c.Socket, http.MethodPost, "/v1/send", strings.NewReader(good)); code != http.StatusOK || strings.Count(body, "\n") != 1 || !strings.HasSuffix(body, "}\n") {
		t.Errorf("good send: %d %q; want 200 and one line of JSON", code, body)
	}
	// An unknown device is bad input too.
	if _, err := c.Send(context.Background(), "dev-z", "set", nil); !strings.Contains(fmt.Sprint(err), "unknown device") {
		t.Fatalf("unknown device: %v", err)
	}

	if n := a.Status().Counters.APIRefused; n != 8 {
		t.Errorf("status api_requests_refused = %d, want 8", n)
	}
	srv := httptest.NewServer(a.MetricsHandler("test"))
	defer srv.Close()
	mf := scrape(t, srv)
	for why, n := range map[string]float64{"malformed": 2, "bad_body": 4, "too_large": 1, "unknown_device": 1} {
		wantSample(t, mf, n, "edgefence_api_requests_refused_total", "reason", why)
	}
	refusals := 0
	for _, l := range logs.lines(t) {
		if l["msg"] == "api request refused" {
			refusals++
			if l["level"] != "WARN" || l["reason"] == nil || l["err"] == nil {
				t.Errorf("refusal line: %v", l)
			}
		}
	}
	if refusals != 8 {
		t.Errorf("%d refusal log lines, want 8", refusals)
	}
}
