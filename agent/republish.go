package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/internal/backoff"
)

// Republishing (invariant I8): gateways read the operator's statements
// from etcd (TrustCertKey, TrustDeviceKey, TrustRevocationsKey). When
// etcd is rebuilt without them — wiped, or restored from a snapshot older
// than them — the ones this agent keeps (trust.go) go back: at start, and
// whenever etcd is seen to have lost data — its revision went back, or the
// agent's marker (republishedKey, written after each pass) is gone —, the
// agent writes each one etcd lacks or holds an older one of (a lower
// serial or version), in a transaction on what it read. They are root-signed, so this restores
// only what the operator issued; a statement another writer put there
// that is not the root's is replaced.

// republishEvery is how often the agent looks at etcd's revision.
const republishEvery = 10 * time.Second

// republishBatch is how many keys one transaction reads or writes (etcd's
// default --max-txn-ops is 128).
const republishBatch = 64

// republishedKey is the agent's marker in etcd: written after each pass,
// so that an etcd that lost it lost the statements too.
func republishedKey(prefix, gateway string) string { return prefix + "/trust/republished/" + gateway }

// republisher puts the keeper's statements back into etcd.
type republisher struct {
	keep   *keeper
	cli    *clientv3.Client
	prefix string
	marker string        // republishedKey
	every  time.Duration // how often it looks (republishEvery)
	done   atomic.Uint64 // statements written, for Status and metrics
}

// run republishes once etcd answers, then each time etcd's revision goes
// back, until ctx ends.
func (r *republisher) run(ctx context.Context) {
	delay := backoff.Backoff{Min: time.Second, Max: time.Minute}
	var last int64
	first := true
	for {
		rev, marked, err := r.look(ctx)
		if err == nil && (first || rev < last || !marked) {
			if !first {
				r.keep.log.Warn("etcd lost data (rebuilt or restored): checking the trust statements there", "revision", rev, "seen", last,
					"marker", marked)
			}
			if err = r.once(ctx); err == nil {
				err = r.mark(ctx)
			}
		}
		wait := r.every
		if err != nil {
			wait = delay.Next()
			if ctx.Err() == nil {
				r.keep.log.Warn("trust statements not checked in etcd; will retry", "err", err, "retry_in", wait)
			}
		} else {
			delay.Reset()
			first, last = false, max(last, rev)
		}
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// look returns etcd's current revision and whether the agent's marker is
// there.
func (r *republisher) look(ctx context.Context) (rev int64, marked bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := r.cli.Get(clientv3.WithRequireLeader(ctx), r.marker, clientv3.WithCountOnly())
	if err != nil {
		return 0, false, err
	}
	return resp.Header.Revision, resp.Count > 0, nil
}

// mark writes the agent's marker.
func (r *republisher) mark(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := r.cli.Put(clientv3.WithRequireLeader(ctx), r.marker, time.Now().UTC().Format(time.RFC3339))
	return err
}

// once writes every statement of the keeper etcd lacks or holds an older
// one of.
func (r *republisher) once(ctx context.Context) error {
	type item struct {
		key string
		st  *auth.Statement
	}
	var items []item
	for _, raw := range r.keep.t.Statements() {
		st, _ := r.keep.t.Check(raw) // held: the statement comes back with ErrHeld
		if st == nil {
			continue
		}
		if key := r.key(st); key != "" {
			items = append(items, item{key, st})
		}
	}
	n := 0
	for len(items) > 0 {
		batch := items[:min(len(items), republishBatch)]
		items = items[len(batch):]
		ops := make([]clientv3.Op, len(batch))
		for i, it := range batch {
			ops[i] = clientv3.OpGet(it.key)
		}
		resp, err := r.txn(ctx, nil, ops)
		if err != nil {
			return err
		}
		for i, it := range batch {
			w, err := r.put(ctx, it.key, it.st, resp.Responses[i].GetResponseRange().Kvs)
			if err != nil {
				return err
			}
			n += w
		}
	}
	if n > 0 {
		r.done.Add(uint64(n))
		r.keep.log.Warn("trust statements put back into etcd (it had lost them)", "statements", n)
	}
	return nil
}

// key is where st lives in etcd ("" if nowhere).
func (r *republisher) key(st *auth.Statement) string {
	switch {
	case st.Certificate != nil && st.Certificate.Role == auth.RoleDevice && len(st.Certificate.Devices) == 1:
		return TrustDeviceKey(r.prefix, st.Certificate.Devices[0])
	case st.Certificate != nil && st.Certificate.Role == auth.RoleGateway:
		return TrustCertKey(r.prefix, string(st.Certificate.KeyID))
	case st.Revocations != nil:
		return TrustRevocationsKey(r.prefix)
	}
	return ""
}

// put writes st at key unless what etcd holds there (kvs) is at least as
// new in its slot, or is a statement of another slot (a device enrolled
// anew under another key id); it returns 1 if it wrote.
func (r *republisher) put(ctx context.Context, key string, st *auth.Statement, kvs []*mvccpb.KeyValue) (int, error) {
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if len(kvs) == 1 {
		held, err := r.keep.t.Check(kvs[0].Value)
		if held != nil {
			if errors.Is(err, auth.ErrHeld) || held.Slot() != st.Slot() || held.Rank() >= st.Rank() {
				return 0, nil
			}
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)
	}
	resp, err := r.txn(ctx, []clientv3.Cmp{cmp}, []clientv3.Op{clientv3.OpPut(key, string(st.Raw))})
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, nil // written meanwhile: the next pass looks again if it must
	}
	return 1, nil
}

func (r *republisher) txn(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := r.cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return resp, nil
}

// runRepublish starts the republisher (if any) under ctx; the func
// returned stops it and waits for it.
func (a *Agent) runRepublish(ctx context.Context) func() {
	if a.repub == nil {
		return func() {}
	}
	return goUnder(ctx, a.repub.run)
}
