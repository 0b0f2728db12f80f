package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// bumpEtcds are the etcds the bump is tested on, each a fresh one of its
// own (compaction would disturb the shared testEtcd's other tests): the
// embedded one and Debian's 3.4 binary.
var bumpEtcds = map[string]func(t *testing.T) (*clientv3.Client, []string){
	"embedded": func(t *testing.T) (*clientv3.Client, []string) {
		e, err := sandbox.StartEtcd(t.Context(), sandbox.EtcdConfig{Dir: t.TempDir(), Fast: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		c, err := e.Client()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, e.Endpoints()
	},
	"debian": func(t *testing.T) (*clientv3.Client, []string) {
		e := sandbox.NewEtcdProc(t, sandbox.EtcdProcConfig{Fast: true})
		c, err := e.Client()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, e.Endpoints()
	},
}

// The bump raises the revision past the target with single writes, deletes
// its scratch key, and its compaction keeps a held lock: the same key, the
// same CreateRevision (token), still the owner's.
func TestBumpRevision(t *testing.T) {
	for name, start := range bumpEtcds {
		t.Run(name, func(t *testing.T) {
			cli, _ := start(t)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			m := concurrency.NewMutex(sess, DefaultEtcdPrefix+"/devices/dev-1/lock")
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			token := m.Header().Revision
			if _, err := cli.Put(ctx, DefaultEtcdPrefix+"/devices/dev-1/twin/desired", `{"state":{}}`); err != nil {
				t.Fatal(err)
			}

			const gap = 1000
			to := token + gap
			var mu sync.Mutex
			var seen []BumpProgress
			res, err := BumpRevision(ctx, cli, BumpConfig{To: to, Compact: true, CompactEvery: gap / 3,
				ProgressEvery: 5 * time.Millisecond, Progress: func(p BumpProgress) {
					mu.Lock()
					seen = append(seen, p)
					mu.Unlock()
				}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d writes in %v: %.0f/s; final %d, compacted %d, %d progress reports", res.Writes, res.Elapsed, res.Rate(), res.Final, res.Compacted, len(seen))
			if !res.Done || res.Revision < to || res.Writes < gap || res.Final <= res.Revision || res.Compacted != res.Final {
				t.Fatalf("result %+v: want done at ≥ %d, ≥ %d writes, compacted to the final revision", res, to, gap)
			}
			for i, p := range seen {
				if p.To != to || p.Revision < p.From || (i > 0 && p.Revision < seen[i-1].Revision) {
					t.Fatalf("progress %d: %+v after %+v", i, p, seen[max(0, i-1)])
				}
			}
			put, err := cli.Put(ctx, "after", "")
			if err != nil || put.Header.Revision <= to {
				t.Fatalf("a write after the bump: %v, %v; want a revision above %d", put, err, to)
			}
			if g, err := cli.Get(ctx, DefaultEtcdPrefix+BumpScratchKey); err != nil || len(g.Kvs) != 0 {
				t.Fatalf("scratch key left: %v, %v", g, err)
			}
			g, err := cli.Get(ctx, m.Key())
			if err != nil || len(g.Kvs) != 1 || g.Kvs[0].CreateRevision != token || clientv3.LeaseID(g.Kvs[0].Lease) != sess.Lease() {
				t.Fatalf("lock key after compaction: %v, %v; want it with create revision %d", g, err, token)
			}
			own, err := cli.Txn(ctx).If(m.IsOwner()).Commit()
			if err != nil || !own.Succeeded {
				t.Fatalf("the lock holder's fenced write fails after compaction: %v, %v", own, err)
			}
			if g, err := cli.Get(ctx, DefaultEtcdPrefix+"/devices/dev-1/twin/desired"); err != nil || len(g.Kvs) != 1 {
				t.Fatalf("twin after compaction: %v, %v", g, err)
			}
			if _, err := cli.Get(ctx, "after", clientv3.WithRev(token)); !errors.Is(err, rpctypes.ErrCompacted) {
				t.Fatalf("read below the compaction: %v, want ErrCompacted", err)
			}

			t.Run("already there", func(t *testing.T) {
				res, err := BumpRevision(ctx, cli, BumpConfig{To: to})
				if err != nil || !res.Done || res.Writes != 0 || res.Compacted != 0 {
					t.Fatalf("%+v, %v; want done with no write", res, err)
				}
			})
			t.Run("sample", func(t *testing.T) {
				res, err := BumpRevision(ctx, cli, BumpConfig{To: 1 << 40, For: 100 * time.Millisecond, Writers: 4})
				if err != nil || res.Done || res.Writes == 0 || res.Rate() <= 0 || res.ETA() <= 0 {
					t.Fatalf("%+v, %v; want some writes, a rate and an estimate", res, err)
				}
				if g, err := cli.Get(ctx, DefaultEtcdPrefix+BumpScratchKey); err != nil || len(g.Kvs) != 0 {
					t.Fatalf("scratch key left: %v, %v", g, err)
				}
			})
			t.Run("interrupted", func(t *testing.T) {
				ictx, stop := context.WithCancel(ctx)
				defer stop()
				var once sync.Once
				res, err := BumpRevision(ictx, cli, BumpConfig{Prefix: "/other", To: 1 << 40, ProgressEvery: 5 * time.Millisecond,
					Progress: func(p BumpProgress) {
						if p.Writes > 0 {
							once.Do(stop)
						}
					}})
				if !errors.Is(err, context.Canceled) || res.Done || res.Writes == 0 || res.Final == 0 {
					t.Fatalf("%+v, %v; want context.Canceled after some writes, cleaned up", res, err)
				}
				if g, err := cli.Get(ctx, "/other"+BumpScratchKey); err != nil || len(g.Kvs) != 0 {
					t.Fatalf("scratch key left: %v, %v", g, err)
				}
			})
		})
	}
	if _, err := BumpRevision(t.Context(), nil, BumpConfig{}); !errors.Is(err, ErrBumpNoTarget) {
		t.Fatalf("no target: %v, want ErrBumpNoTarget", err)
	}
}

// A slow rate and a far target: the estimate saturates instead of
// overflowing into a negative Duration (a loaded machine hit it).
func TestBumpETASaturates(t *testing.T) {
	p := BumpProgress{Revision: 1, To: 1 << 40, Writes: 10, Elapsed: time.Second}
	if eta := p.ETA(); eta <= 0 {
		t.Fatalf("ETA %v, want positive", eta)
	}
	if eta := (BumpProgress{Revision: 1, To: 100, Writes: 1, Elapsed: time.Second}).ETA(); eta != 99*time.Second {
		t.Fatalf("ETA %v, want 99s", eta)
	}
}
