package fence

import (
	"context"
	"time"
)

// SetBatch sets the bbolt settings AdmitBatch commits with; call it before
// the first AdmitBatch.
func (t *Table) SetBatch(delay time.Duration, size int) {
	t.db.MaxBatchDelay, t.db.MaxBatchSize = delay, size
}

// AdmitBatch is Admit with the decision committed by bbolt's DB.Batch (at
// the SetBatch settings) instead of the table's own group commit: the same
// cache check, the same admit call (admitCall.run is idempotent per
// transaction, as Batch requires), the same raise. Only
// BenchmarkGroupCommit uses it, to compare the two approaches on the same
// work.
func (t *Table) AdmitBatch(ctx context.Context, env *Envelope) (Verdict, Mark, error) {
	if err := env.Validate(); err != nil {
		return Invalid, Mark{}, err
	}
	if err := ctx.Err(); err != nil {
		return 0, Mark{}, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if cur, ok := t.cached(env.Device); ok {
		if v, st, _ := AdmitEpoch(0, cur, env.Epoch, env.Token, env.Seq); v != Accepted {
			return v, st.Mark, nil
		}
	}
	c := newAdmitCall(env, 0, t.opts.Now().UnixMilli())
	if err := t.db.Batch(c.run); err != nil {
		return 0, Mark{}, t.storageErr(env.Device, err)
	}
	if c.v == Accepted {
		t.raise(env.Device, c.st)
	}
	return c.v, c.st.Mark, nil
}
