package shadow_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/edgefence/edgefence/internal/sandbox"
	"github.com/edgefence/edgefence/shadow"
)

// testEtcd is one real embedded etcd for the package's tests; each test
// uses its own key prefix.
var testEtcd *sandbox.Etcd

// TestMain starts the embedded etcd and, after the tests, checks that none
// left a goroutine behind (watches, sessions, clients).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shadow-etcd-")
	if err != nil {
		panic(err)
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

// countingClient is an etcd client that counts its unary requests (KV
// Range, Txn, Put, ...): the figure "etcd requests per update".
type countingClient struct {
	*clientv3.Client
	reqs atomic.Int64
}

func newClient(tb testing.TB) *countingClient {
	tb.Helper()
	cc := &countingClient{}
	count := func(ctx context.Context, method string, req, reply any, conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		cc.reqs.Add(1)
		return invoker(ctx, method, req, reply, conn, opts...)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   testEtcd.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	cc.Client = c
	return cc
}

var prefixes atomic.Int64

// newPrefix returns an etcd prefix no other test uses.
func newPrefix() string { return fmt.Sprintf("/shadowtest/%d", prefixes.Add(1)) }

func newStore(tb testing.TB, cli *clientv3.Client, prefix, writer string) *shadow.Store {
	tb.Helper()
	return shadow.NewStore(cli, shadow.StoreConfig{Prefix: prefix, Writer: writer})
}

// holder is a real lease holder: a session and a concurrency.Mutex locked
// on the device's lock prefix, with its token read from its own key (I2).
type holder struct {
	sess  *concurrency.Session
	mu    *concurrency.Mutex
	key   string
	token int64
}

func lockDevice(tb testing.TB, cli *clientv3.Client, st *shadow.Store, dev string) *holder {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sess.Close() })
	m := concurrency.NewMutex(sess, st.LockPrefix(dev))
	if err := m.Lock(ctx); err != nil {
		tb.Fatal(err)
	}
	r, err := cli.Get(ctx, m.Key())
	if err != nil || len(r.Kvs) != 1 {
		tb.Fatalf("read own lock key: %v %v", r, err)
	}
	return &holder{sess: sess, mu: m, key: m.Key(), token: r.Kvs[0].CreateRevision}
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// rev returns etcd's current store revision.
func rev(tb testing.TB, cli *clientv3.Client) int64 {
	tb.Helper()
	r, err := cli.Get(context.Background(), "/shadowtest/none")
	if err != nil {
		tb.Fatal(err)
	}
	return r.Header.Revision
}

// obj parses a JSON object for test tables.
func obj(tb testing.TB, s string) map[string]any {
	tb.Helper()
	m, err := shadow.DecodeJSON([]byte(s), shadow.Limits{})
	if err != nil {
		tb.Fatalf("parse %s: %v", s, err)
	}
	return m
}

func js(v any) string {
	b, err := shadowJSON(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(b)
}
