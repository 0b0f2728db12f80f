package sandbox

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// wipeable is what the recovery tests need of either etcd.
type wipeable interface {
	Client() (*clientv3.Client, error)
	Restart(context.Context) error
	Wipe(context.Context) error
}

// Both etcds — Debian's binary as a subprocess and the embedded one — keep
// their data and endpoint across Restart, and Wipe starts a new cluster on
// the same endpoint whose revisions begin at 1 again.
func TestEtcdRestartWipe(t *testing.T) {
	for name, start := range map[string]func(t *testing.T) wipeable{
		"debian": func(t *testing.T) wipeable {
			e := NewEtcdProc(t, EtcdProcConfig{Fast: true})
			v, err := e.Version()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("etcd %s at %s", v, e.Endpoint())
			return e
		},
		"embedded": func(t *testing.T) wipeable { return startEtcd(t, EtcdConfig{Fast: true}) },
	} {
		t.Run(name, func(t *testing.T) {
			e := start(t)
			c, err := e.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var rev int64
			for range 5 {
				r, err := c.Put(ctx, "k", "v")
				if err != nil {
					t.Fatal(err)
				}
				rev = r.Header.Revision
			}
			if err := e.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			g, err := c.Get(ctx, "k")
			if err != nil || len(g.Kvs) != 1 || g.Header.Revision != rev {
				t.Fatalf("after restart: %v, %v; want k at revision %d", g, err, rev)
			}
			if err := e.Wipe(ctx); err != nil {
				t.Fatal(err)
			}
			g, err = c.Get(ctx, "k")
			if err != nil || len(g.Kvs) != 0 || g.Header.Revision != 1 {
				t.Fatalf("after wipe: %v, %v; want no key at revision 1", g, err)
			}
		})
	}
}
