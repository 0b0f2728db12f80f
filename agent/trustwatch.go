package agent

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/backoff"
)

// follow learns the operator's statements in etcd that concern every
// device — the revocation list (TrustRevocationsKey) and the fleet's epoch
// (TrustEpochKey) — and the resets of the agent's own devices
// (TrustResetKey): what is there now, then every change, each verified
// against the root before it counts. It retries until ctx ends.
func (k *keeper) follow(ctx context.Context, cli *clientv3.Client, prefix string, reset func(dev string, raw []byte)) {
	delay := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		err := k.followOnce(ctx, cli, prefix, reset)
		if ctx.Err() != nil {
			return
		}
		k.log.Warn("watching the trust statements in etcd; will retry", "prefix", prefix+"/trust/", "err", err)
		if !backoff.Sleep(ctx, delay.Next()) {
			return
		}
	}
}

func (k *keeper) followOnce(ctx context.Context, cli *clientv3.Client, prefix string, reset func(dev string, raw []byte)) error {
	list, epoch, resets := TrustRevocationsKey(prefix), TrustEpochKey(prefix), TrustResetKey(prefix, "")
	take := func(key string, raw []byte) {
		switch {
		case key == list || key == epoch:
			k.fromEtcd(key, raw)
		case strings.HasPrefix(key, resets) && reset != nil:
			reset(strings.TrimPrefix(key, resets), raw)
		}
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(clientv3.OpGet(list), clientv3.OpGet(epoch),
		clientv3.OpGet(resets, clientv3.WithPrefix())).Commit()
	if err != nil {
		return err
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			take(string(kv.Key), kv.Value)
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, prefix+"/trust/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				take(string(ev.Kv.Key), ev.Kv.Value)
			}
		}
	}
	return ctx.Err()
}

// fromEtcd learns the statement at key.
func (k *keeper) fromEtcd(key string, raw []byte) {
	st, news, err := k.learn(raw, "etcd "+key)
	switch {
	case err != nil:
		k.log.Warn("trust statement in etcd refused: not the operator root's", "key", key, "err", err)
	case !news && st.Revocations != nil && st.Revocations.Version < k.t.Version():
		k.log.Info("revocation list ignored: not newer than the one relayed", "key", key, "version", st.Revocations.Version,
			"relayed", k.t.Version())
	case !news && st.Epoch != nil && st.Epoch.Number < k.t.Epoch():
		k.log.Info("epoch statement ignored: not newer than the one held", "key", key, "epoch", st.Epoch.Number, "held", k.t.Epoch())
	}
}
