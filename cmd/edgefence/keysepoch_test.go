package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// `edgefence keys epoch`: the root signs the fleet's epoch statement (by
// default at the current Unix time in milliseconds, or above the highest
// epoch etcd holds, the fleet's or any device's reset's), writes it, and
// publishes it at <prefix>/trust/epoch only over a lower one, verified
// against the root first: a lower or equal epoch, another key's
// statement, a statement of another kind are refused, etcd unchanged.
func TestKeysEpoch(t *testing.T) {
	dir, p, ok := keysDir(t)
	etcd, cli := startEtcd(t, dir)
	ok("keys", "new", "--out", p("operator"))
	ok("keys", "new", "--out", p("gw-1"))
	trust := loadTrust(t, p("operator.pub"))
	key := agent.TrustEpochKey(agent.DefaultEtcdPrefix)
	held := func() uint64 {
		t.Helper()
		resp, err := cli.Get(t.Context(), key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s: %v %v", key, resp, err)
		}
		st, err := trust.Check(resp.Kvs[0].Value)
		if err != nil || st.Epoch == nil {
			t.Fatalf("%s holds no epoch statement of the root: %v", key, err)
		}
		return st.Epoch.Number
	}
	epoch := func(args ...string) result {
		t.Helper()
		return edgefence(t, append([]string{"keys", "epoch"}, args...)...)
	}
	pubTo := []string{"--etcd", etcd.Endpoint(), "--root-pub", p("operator.pub")}

	// Offline, by the clock.
	before := uint64(time.Now().UnixMilli())
	ok("keys", "epoch", "--root-key", p("operator.key"), "--out", p("e1"))
	raw, err := os.ReadFile(p("e1"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := trust.Check(raw); err != nil || st.Epoch.Number < before || st.Epoch.Number > uint64(time.Now().UnixMilli()) {
		t.Fatalf("--out: %+v %v", st, err)
	}

	// Published; only higher ones after it.
	if r := epoch(append([]string{"--root-key", p("operator.key"), "--epoch", "1125899906842624"}, pubTo...)...); r.code != 0 ||
		!strings.Contains(r.stdout, "published epoch 1125899906842624 at "+key) || held() != 1125899906842624 {
		t.Fatalf("publish\n%s", r)
	}
	for _, n := range []string{"5", "1125899906842624"} {
		if r := epoch(append([]string{"--root-key", p("operator.key"), "--epoch", n}, pubTo...)...); r.code == 0 || !strings.Contains(r.stderr, "at least as high") {
			t.Fatalf("epoch %s over 2^50\n%s", n, r)
		}
	}
	if r := epoch(append([]string{"--from", p("e1")}, pubTo...)...); r.code == 0 || held() != 1125899906842624 {
		t.Fatalf("the clock's epoch over 2^50\n%s", r)
	}
	// Not the root's: a gateway's key signing in the root's name, a
	// revocation list.
	if r := epoch(append([]string{"--root-key", p("gw-1.key"), "--root-kid", "operator", "--epoch", "1125899906842999"}, pubTo...)...); r.code == 0 ||
		!strings.Contains(r.stderr, "not an epoch statement of this root") || held() != 1125899906842624 {
		t.Fatalf("a gateway key's statement\n%s", r)
	}
	ok("keys", "revoke", "--root-key", p("operator"), "--version", "9", "--out", p("list"))
	if r := epoch(append([]string{"--from", p("list")}, pubTo...)...); r.code == 0 || held() != 1125899906842624 {
		t.Fatalf("a revocation list as the epoch\n%s", r)
	}

	// The default is above the highest epoch etcd holds: the fleet's, or
	// a device's reset's.
	r := epoch(append([]string{"--root-key", p("operator.key")}, pubTo...)...)
	if r.code != 0 || held() != 1125899906842625 {
		t.Fatalf("default above the fleet's\n%s", r)
	}
	root := operatorRoot(t, p("operator.key"))
	reset, err := root.Reset(auth.Reset{Device: "dev-9", Token: 1, Seq: 1, Counter: 1, ID: "reset:r", Epoch: 1 << 51})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), agent.TrustResetKey(agent.DefaultEtcdPrefix, "dev-9"), string(reset)); err != nil {
		t.Fatal(err)
	}
	if r := epoch(append([]string{"--root-key", p("operator.key")}, pubTo...)...); r.code != 0 || held() != 1<<51+1 {
		t.Fatalf("default above a device's reset: %d\n%s", held(), r)
	}
	if r := epoch("--root-key", p("operator.key")); r.code != 2 {
		t.Fatalf("neither --out nor etcd\n%s", r)
	}
	if !strings.Contains(edgefence(t, "keys", "epoch", "--help").stderr, "keys epoch --root-key FILE") {
		t.Fatal("usage does not name keys epoch")
	}
}

// startEtcd starts a fast etcd in dir and returns it with a client, both
// closed when the test ends.
func startEtcd(t *testing.T, dir string) (*sandbox.Etcd, *clientv3.Client) {
	t.Helper()
	etcd, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: filepath.Join(dir, "etcd"), Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return etcd, cli
}

// operatorRoot is the root signer of the key file.
func operatorRoot(t *testing.T, keyFile string) *auth.Root {
	t.Helper()
	k, err := auth.ReadKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := auth.NewRoot([]byte("operator"), k)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
