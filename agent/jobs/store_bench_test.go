package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
)

// BenchmarkStoreStartFinish: executions of one job started and finished
// (Start + Finish, each writing the rollout key) by conc concurrent
// writers spread over gw gateways (a Store and an etcd client each),
// max_concurrent conc: the rollout key's contention. One op is one
// execution's Start and Finish; queued beforehand, untimed.
func BenchmarkStoreStartFinish(b *testing.B) {
	for _, c := range []struct{ conc, gw int }{{1, 1}, {10, 1}, {50, 1}, {50, 2}, {50, 10}} {
		b.Run(fmt.Sprintf("concurrent=%d/gateways=%d", c.conc, c.gw), func(b *testing.B) { benchStartFinish(b, c.conc, c.gw) })
	}
}

func benchStartFinish(b *testing.B, conc, gw int) {
	var reqs atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		reqs.Add(1)
		return invoker(ctx, method, req, reply, conn, opts...)
	}
	cli := newClient(b)
	prefix := newPrefix()
	var stores []*jobs.Store
	for range gw {
		c, err := clientv3.New(clientv3.Config{Endpoints: testEtcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		stores = append(stores, jobs.NewStore(c, prefix))
	}
	st := jobs.NewStore(cli, prefix)
	ctx := context.Background()
	j := testJob("fw-b")
	j.Targets = jobs.Targets{Match: []string{"dev-*"}}
	j.Rollout.MaxConcurrent = conc
	if _, _, err := st.Create(ctx, j); err != nil {
		b.Fatal(err)
	}
	execs, holders := benchQueue(b, st, cli, b.N)
	var next, notYet atomic.Int64
	var wg sync.WaitGroup
	reqs.Store(0)
	b.ResetTimer()
	t0 := time.Now()
	for w := range conc {
		st := stores[w%gw]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < b.N; i = int(next.Add(1)) - 1 {
				e, err := st.Start(ctx, execs[i], holders[i])
				for errors.Is(err, jobs.ErrNotYet) {
					notYet.Add(1)
					e, err = st.Start(ctx, execs[i], holders[i])
				}
				if err == nil {
					_, _, err = st.Finish(ctx, e, jobs.Succeeded, "", holders[i])
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "pairs/s")
	b.ReportMetric(float64(notYet.Load())/float64(b.N), "notyet/op")
	b.ReportMetric(float64(reqs.Load())/float64(b.N), "etcd-reqs/op")
}

// benchQueue makes n devices, each with a lock key (a plain key: its
// CreateRevision is the token) and a queued execution.
func benchQueue(b *testing.B, st *jobs.Store, cli *clientv3.Client, n int) ([]jobs.Execution, []jobs.Holder) {
	b.Helper()
	ctx := context.Background()
	execs, holders := make([]jobs.Execution, n), make([]jobs.Holder, n)
	for i := range n {
		dev := fmt.Sprintf("dev-%06d", i)
		key := st.LockPrefix(dev) + "/1"
		r, err := cli.Put(ctx, key, "")
		if err != nil {
			b.Fatal(err)
		}
		holders[i] = jobs.Holder{Gateway: fmt.Sprintf("gw-%d", i%2), LockKey: key, Token: fence.Token(r.Header.Revision)}
		if execs[i], err = st.Queue(ctx, dev, "fw-b", holders[i]); err != nil {
			b.Fatal(err)
		}
	}
	return execs, holders
}
