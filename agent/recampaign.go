package agent

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/backoff"
)

// After a fence point refused our token, or the regression guard refused
// it before anything was sent, the agent deletes its lock key — so that the
// lock moves on to the next gateway instead of staying with a controller
// that may not command the device — and campaigns for the device again
// after refusalBackoff: the n-th release in a row waits about
// refusalBackoffMin·2ⁿ⁻¹, at most refusalBackoffMax, with jitter, so that
// gateways a regression refuses one after the other do not bounce the lock
// between them. An accepted command resets the count.
const (
	refusalBackoffMin = time.Second
	refusalBackoffMax = 30 * time.Second
)

// refusalBackoff is the wait before the n-th campaign after a refusal
// (n ≥ 1): the exponential step with "equal jitter" (half fixed, half
// random), in [step/2, step] for the step 1 s·2ⁿ⁻¹ capped at 30 s.
func refusalBackoff(n int) time.Duration {
	b := backoff.Backoff{Min: refusalBackoffMin / 2, Max: refusalBackoffMax, Jitter: backoff.Equal}
	return b.Delay(n - 1)
}

// recampaign lets d's lock key (token, under lease) go and campaigns for d
// again after the backoff, under the same session. stale means a fence
// point refused the token as stale: it then tells a token regression (our
// key still holds the lock, so no newer holder can exist: the device's mark
// comes from a past etcd) from a deposition (our key is gone: a newer
// holder took the lock). If the session has ended meanwhile, the next one
// campaigns anew and there is nothing to do.
func (l *leases) recampaign(d *device, token fence.Token, key string, lease clientv3.LeaseID, stale bool) {
	l.mu.Lock()
	r := l.run
	if r == nil || r.ended || r.sess.Lease() != lease {
		l.mu.Unlock()
		return
	}
	r.wg.Add(1)
	l.mu.Unlock()
	d.mu.Lock()
	d.refusals++
	wait := refusalBackoff(d.refusals)
	d.mu.Unlock()
	go func() {
		defer r.wg.Done()
		if stale {
			l.classifyStale(r.ctx, d, token, key, lease)
		}
		if err := l.letGo(r.ctx, key, lease); err != nil {
			// The key stays until the session ends; the next campaign
			// finds it again, is refused again and tries again.
			l.log.Warn("cannot release the lock after a refusal", "device", d.id, "token", token, "key", key, "err", err)
		} else {
			l.stats.released.Add(1)
			l.log.Warn("lock released after a refusal", "device", d.id, "token", token, "key", key, "holder", l.gateway,
				"retry_in", wait.Round(time.Millisecond))
		}
		if !sleepOrRetry(r.ctx, wait, d.retry) || !acquireSlot(r.ctx, r.slots) {
			return
		}
		l.campaign(r, d)
	}()
}

// sleepOrRetry waits d, or until retry is signalled; false if ctx ended.
func sleepOrRetry(ctx context.Context, d time.Duration, retry <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-retry:
	}
	return true
}

// retryNow cuts d's refusal backoff short and starts its exponent over:
// what refused it (a token regression) is gone.
func (d *device) retryNow() {
	d.mu.Lock()
	d.refusals = 0
	d.mu.Unlock()
	select {
	case d.retry <- struct{}{}:
	default:
	}
}

// letGo deletes key if it is still under lease (it is ours).
func (l *leases) letGo(ctx context.Context, key string, lease clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(ctx, l.etcd.DialTimeout)
	defer cancel()
	_, err := l.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).Then(clientv3.OpDelete(key)).Commit()
	return err
}

// classifyStale decides, after a fence point refused our token as stale,
// whether that is a token regression. While our lock key exists with the
// token as its CreateRevision, no other key can have held the lock since:
// a higher mark at the device cannot come from this etcd's holders — the
// cluster was rebuilt or wiped, whether or not this gateway ever held the
// device. The same holds if etcd's revision is not even up to the mark.
func (l *leases) classifyStale(ctx context.Context, d *device, token fence.Token, key string, lease clientv3.LeaseID) {
	d.mu.Lock()
	mark := d.fenceMark
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.etcd.DialTimeout)
	defer cancel()
	resp, err := l.cli.Get(ctx, key)
	if err != nil {
		l.log.Warn("cannot tell a deposition from a token regression", "device", d.id, "token", token, "err", err)
		return
	}
	held := len(resp.Kvs) == 1 && fence.Token(resp.Kvs[0].CreateRevision) == token && clientv3.LeaseID(resp.Kvs[0].Lease) == lease
	if !held && fence.Token(resp.Header.Revision) >= mark {
		return // deposed by a newer holder: state lost, set by deposed
	}
	l.refuse(d, token, regressionReason(token, mark), true)
}

// noteMark records the token a fence point of d said it holds.
func (d *device) noteMark(ack *fence.Ack) {
	if ack.Verdict == fence.Stale && ack.MaxToken > d.fenceMark {
		d.fenceMark = ack.MaxToken
	}
}
