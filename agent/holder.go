package agent

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
)

// holderInfo is the owner of a device's lock while another session holds
// it: the gateway id its key carries (holders stamp it, readToken), the
// key's CreateRevision (its token) and when this agent first saw it hold.
type holderInfo struct {
	gateway string // "" for a holder that stamps nothing, e.g. `etcdctl lock`
	key     string
	token   fence.Token
	since   time.Time
}

// noteHolder reads who holds d's lock (the key with the lowest
// CreateRevision under its prefix) for Status. It is best effort: an error
// leaves the last reading.
func (l *leases) noteHolder(ctx context.Context, d *device) {
	ctx, cancel := context.WithTimeout(ctx, l.etcd.DialTimeout)
	defer cancel()
	resp, err := l.cli.Get(ctx, l.lockPrefix(d.id)+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return
	}
	kv := resp.Kvs[0]
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctl != nil && !d.ctl.lost.Load() {
		return // ours by now
	}
	if d.holder.key != string(kv.Key) || d.holder.token != fence.Token(kv.CreateRevision) {
		d.holder = holderInfo{gateway: string(kv.Value), key: string(kv.Key), token: fence.Token(kv.CreateRevision), since: l.now()}
	}
}
