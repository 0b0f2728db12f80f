package agent

import (
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/edgefence/edgefence/fence"
)

// holderInfo is the owner of a device's lock while another session holds
// it: the gateway id its key carries (holders stamp it when they take the turn, takeTurn), the
// key's CreateRevision (its token) and when this agent first saw it hold.
type holderInfo struct {
	gateway string // "" for a holder that stamps nothing, e.g. `etcdctl lock`
	key     string
	token   fence.Token
	since   time.Time
}

// noteHolder records kv, the first key in d's lock queue (the lowest
// CreateRevision) and not ours, as d's holder for Status.
func (l *leases) noteHolder(d *device, kv *mvccpb.KeyValue) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctl != nil && !d.ctl.lost.Load() {
		return // ours by now
	}
	if d.holder.key != string(kv.Key) || d.holder.token != fence.Token(kv.CreateRevision) {
		d.holder = holderInfo{gateway: string(kv.Value), key: string(kv.Key), token: fence.Token(kv.CreateRevision), since: l.now()}
	}
}
