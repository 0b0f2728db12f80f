package shadow_test

import (
	"context"
	"testing"

	"github.com/edgefence/edgefence/shadow"
)

// TestLastReportedReadsOnce: LastReported reads etcd once, then answers
// from what the store remembers, until Forget.
func TestLastReportedReadsOnce(t *testing.T) {
	cli := newClient(t)
	s := shadow.NewStore(cli.Client, shadow.StoreConfig{Prefix: newPrefix(), Writer: "gw"})
	ctx := context.Background()
	st, err := s.LastReported(ctx, "d1")
	if err != nil || len(st.Fields) != 0 || st.Version != 0 {
		t.Fatalf("empty twin: %+v %v", st, err)
	}
	if _, err := cli.Put(ctx, s.ReportedKey("d1"), `{"state":{"t":1}}`); err != nil {
		t.Fatal(err)
	}
	before := cli.reqs.Load()
	if st, _ := s.LastReported(ctx, "d1"); len(st.Fields) != 0 || cli.reqs.Load() != before {
		t.Fatalf("read etcd again: %+v, %d requests", st, cli.reqs.Load()-before)
	}
	s.Forget("d1")
	if st, err := s.LastReported(ctx, "d1"); err != nil || st.Fields["t"] != float64(1) {
		t.Fatalf("after Forget: %+v %v", st, err)
	}
	if _, err := s.LastReported(ctx, "bad/id"); err == nil {
		t.Fatal("bad device id accepted")
	}
}
