package agent

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/internal/backoff"
)

// prefetch reads the certificates of devs (`auth: required` devices that
// sign their own acks) from etcd, republishBatch keys a transaction, and
// takes in those the trust lacks, one commit a batch. A new holder of
// many devices — a takeover — then verifies their first acks at once,
// instead of one etcd read (and one commit) per device on the MQTT
// delivery goroutine (deviceAuth.reread, which stays for enrolments after
// start). It runs once, retrying a failed batch, until ctx ends.
func (k *keeper) prefetch(ctx context.Context, cli *clientv3.Client, prefix string, devs []string) {
	delay := backoff.Backoff{Min: time.Second, Max: 30 * time.Second}
	learned := 0
	for len(devs) > 0 {
		batch := devs[:min(len(devs), republishBatch)]
		n, err := k.fetch(ctx, cli, prefix, batch)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := delay.Next()
			k.log.Warn("devices' certificates not read from etcd yet; will retry", "err", err, "retry_in", wait)
			if !backoff.Sleep(ctx, wait) {
				return
			}
			continue
		}
		learned += n
		devs = devs[len(batch):]
	}
	if learned > 0 {
		k.log.Info("devices' certificates read from etcd", "learned", learned)
	}
}

// fetch reads devs' certificates and takes in the new ones.
func (k *keeper) fetch(ctx context.Context, cli *clientv3.Client, prefix string, devs []string) (int, error) {
	ops := make([]clientv3.Op, len(devs))
	for i, dev := range devs {
		ops[i] = clientv3.OpGet(TrustDeviceKey(prefix, dev))
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Txn(clientv3.WithRequireLeader(tctx)).Then(ops...).Commit()
	if err != nil {
		return 0, err
	}
	var raws [][]byte
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			raws = append(raws, kv.Value)
		}
	}
	got, err := k.ledger.LearnEach(raws)
	if err != nil {
		return 0, err
	}
	for _, why := range got.Refusals {
		k.log.Warn("a device certificate in etcd refused", "err", why)
	}
	if got.Applied > 0 {
		k.changed()
	}
	return got.Applied, nil
}

// selfSigned returns the `auth: required` devices that sign their own
// acks (not `fence: gateway` ones: their home gateway does), in config
// order.
func (a *Agent) selfSigned() []string {
	var out []string
	for _, id := range a.order {
		if d := a.devices[id]; d.auth == AuthRequired && d.fence != FenceGateway {
			out = append(out, id)
		}
	}
	return out
}
