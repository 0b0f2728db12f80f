package jobs_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/edgefence/edgefence/agent/jobs"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// testEtcd is one real embedded etcd for the package's tests; each test
// uses its own key prefix (newPrefix).
var testEtcd *sandbox.Etcd

// TestMain starts the embedded etcd and, after the tests, checks that none
// left a goroutine behind (watches, sessions, clients).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jobs-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testEtcd, err = sandbox.StartEtcd(context.Background(), sandbox.EtcdConfig{Dir: dir, Fast: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		os.Exit(1)
	}
	code := m.Run()
	testEtcd.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newClient is a client of testEtcd, closed when the test ends.
func newClient(tb testing.TB) *clientv3.Client {
	tb.Helper()
	c, err := testEtcd.Client()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

var prefixes atomic.Int64

// newPrefix returns an etcd prefix no other test uses.
func newPrefix() string { return fmt.Sprintf("/jobstest/%d", prefixes.Add(1)) }

// newStore is a store on a new client under a new prefix.
func newStore(tb testing.TB) (*jobs.Store, *clientv3.Client) {
	tb.Helper()
	cli := newClient(tb)
	return jobs.NewStore(cli, newPrefix()), cli
}

// lockHolder is a real lease holder of a device: a session and a
// concurrency.Mutex locked under the device's lock prefix, its token the
// lock key's CreateRevision (as the agent's leases).
type lockHolder struct {
	jobs.Holder
	sess *concurrency.Session
}

func lockDevice(tb testing.TB, cli *clientv3.Client, st *jobs.Store, dev, gateway string) *lockHolder {
	tb.Helper()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sess.Close() })
	return lockOn(tb, sess, st, dev, gateway)
}

// lockOn locks dev on an existing session (a gateway holding many devices).
func lockOn(tb testing.TB, sess *concurrency.Session, st *jobs.Store, dev, gateway string) *lockHolder {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := concurrency.NewMutex(sess, st.LockPrefix(dev))
	if err := m.Lock(ctx); err != nil {
		tb.Fatal(err)
	}
	r, err := sess.Client().Get(ctx, m.Key())
	if err != nil || len(r.Kvs) != 1 {
		tb.Fatalf("read own lock key: %v %v", r, err)
	}
	return &lockHolder{Holder: jobs.Holder{Gateway: gateway, LockKey: m.Key(), Token: fence.Token(r.Kvs[0].CreateRevision)}, sess: sess}
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// testJob is a valid job on devs.
func testJob(id string, devs ...string) jobs.Job {
	return jobs.Job{ID: id, Image: jobs.ImageRef{SHA256: strings.Repeat("ab", 32), Size: 1000, Version: 2, URL: "file:///srv/fw.bin"},
		Targets: jobs.Targets{Devices: devs}}
}

// snapshot is every key, value and revision under the store's prefix.
func snapshot(tb testing.TB, cli *clientv3.Client, st *jobs.Store) string {
	tb.Helper()
	r, err := cli.Get(context.Background(), strings.TrimSuffix(st.JobKey(""), "jobs/"), clientv3.WithPrefix())
	if err != nil {
		tb.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range r.Kvs {
		fmt.Fprintf(&b, "%s=%s@%d\n", kv.Key, kv.Value, kv.ModRevision)
	}
	return b.String()
}
