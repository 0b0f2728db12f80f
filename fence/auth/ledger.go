package auth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.etcd.io/bbolt"
)

// Ledger is a fence point's memory of the trust updates it learned over
// the air: each new statement is committed (bbolt, fsync) to a bucket
// before it takes effect in the Trust, and OpenLedger replays the bucket
// into the Trust, so that a restart keeps the newest revocation list, the
// newest epoch statement and the certificates learned. Its methods are safe for concurrent use.
type Ledger struct {
	trust  *Trust
	db     *bbolt.DB // nil: memory only
	bucket []byte

	mu sync.Mutex // one update at a time: its commit, then its effect
}

// Learned is what one trust update (or a replay) did, per statement.
type Learned struct {
	Applied int // newer than the one held: committed, then in effect
	Held    int // the one held already: nothing to do
	Refused int // older than the one held, or not the root's (an update refused whole counts each of its statements; one that does not parse, one)
	// Refusals says why, one error per refused statement.
	Refusals []error
}

// ErrLedger means the statements could not be read or written; nothing
// took effect.
var ErrLedger = errors.New("auth: trust ledger")

// OpenLedger returns the ledger of trust in bucket of db (created if
// missing; db nil: memory only) and replays what it holds into trust:
// statements no newer than trust's own (provisioned since) are skipped and
// counted Held or Refused; one that no longer verifies is Refused.
func OpenLedger(trust *Trust, db *bbolt.DB, bucket []byte) (*Ledger, Learned, error) {
	l := &Ledger{trust: trust, db: db, bucket: append([]byte(nil), bucket...)}
	var got Learned
	if db == nil {
		return l, got, nil
	}
	var stored [][]byte
	err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(l.bucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(_, v []byte) error {
			if len(v) > 8 {
				stored = append(stored, append([]byte(nil), v[8:]...))
			}
			return nil
		})
	})
	if err != nil {
		return nil, got, fmt.Errorf("%w: open: %w", ErrLedger, err)
	}
	for _, raw := range stored {
		_, err := trust.Apply(raw)
		got.count(err)
	}
	return l, got, nil
}

// count adds one statement's outcome.
func (g *Learned) count(err error) {
	switch {
	case err == nil:
		g.Applied++
	case errors.Is(err, ErrHeld):
		g.Held++
	default:
		g.Refused++
		g.Refusals = append(g.Refusals, err)
	}
}

// Learn takes in a trust update (ParseUpdate): every statement is checked
// against the root first; if one is not the root's (forged, malformed, of
// a content type an update does not carry) the whole update is refused
// and changes nothing (the error says why). Otherwise the newer statements
// are committed in one transaction (fsync) and then take effect; an older
// one is refused alone (a replayed list cannot un-revoke a key), the one
// held already is skipped. The error is also set, wrapping ErrLedger, when
// the commit fails: then nothing took effect.
func (l *Ledger) Learn(update []byte) (Learned, error) {
	var got Learned
	stmts, err := ParseUpdate(update)
	if err != nil {
		got.Refused, got.Refusals = 1, []error{err}
		return got, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var news []*Statement
	var stale []error
	held := 0
	for i, raw := range stmts {
		st, err := l.trust.Check(raw)
		switch {
		case err == nil:
			news = append(news, st)
		case errors.Is(err, ErrHeld):
			held++
		case errors.Is(err, ErrStaleTrust):
			stale = append(stale, err)
		default:
			err = fmt.Errorf("statement %d of %d, update refused whole: %w", i+1, len(stmts), err)
			got.Refused, got.Refusals = len(stmts), []error{err}
			return got, err
		}
	}
	if err := l.save(news); err != nil {
		got.Refused, got.Refusals = len(stmts), []error{err}
		return got, err
	}
	got.Held = held
	got.Refused, got.Refusals = len(stale), stale
	for _, st := range news {
		got.count(l.trust.Adopt(st)) // something newer came in meanwhile: counted as Check would
	}
	return got, nil
}

// LearnEach takes in statements read one by one (not an update: one that
// is not the root's is refused alone, the others still count): the newer
// ones are committed in one transaction (fsync) and then take effect. The
// error, wrapping ErrLedger, is set only when the commit fails: then
// nothing took effect.
func (l *Ledger) LearnEach(stmts [][]byte) (Learned, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var got Learned
	var news []*Statement
	for _, raw := range stmts {
		st, err := l.trust.Check(raw)
		if err == nil {
			news = append(news, st)
			continue
		}
		got.count(err)
	}
	if err := l.save(news); err != nil {
		return Learned{Refused: len(stmts), Refusals: []error{err}}, err
	}
	for _, st := range news {
		got.count(l.trust.Adopt(st))
	}
	return got, nil
}

// save commits news, each in its slot unless the slot holds a newer one.
func (l *Ledger) save(news []*Statement) error {
	if l.db == nil || len(news) == 0 {
		return nil
	}
	err := l.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(l.bucket)
		if b == nil {
			return errors.New("bucket missing")
		}
		for _, st := range news {
			key := []byte(st.Slot())
			if v := b.Get(key); len(v) >= 8 && binary.BigEndian.Uint64(v) >= st.Rank() {
				continue
			}
			v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(st.Raw)), st.Rank())
			if err := b.Put(key, append(v, st.Raw...)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: commit: %w", ErrLedger, err)
	}
	return nil
}

// Trust returns the Trust the ledger feeds.
func (l *Ledger) Trust() *Trust { return l.trust }

// LearnedCounters count what trust updates did at a fence point, per
// statement (its Stats: TrustApplied, TrustHeld, TrustRefused).
type LearnedCounters struct{ Applied, Held, Refused atomic.Uint64 }

// Add counts g.
func (c *LearnedCounters) Add(g Learned) {
	c.Applied.Add(uint64(g.Applied))
	c.Held.Add(uint64(g.Held))
	c.Refused.Add(uint64(g.Refused))
}

// Log writes what g did to log: a warning per refusal, a line if
// something was applied (replay: what OpenLedger replayed, at Info). args
// say where (device, fence point).
func (g Learned) Log(log *slog.Logger, trust *Trust, replay bool, args ...any) {
	refused, applied := "trust update refused", "trust update applied"
	lvl := slog.LevelWarn
	if replay {
		refused, applied = "stored trust statement not taken (superseded by the provisioned trust, or no longer valid)", "trust learned over the air replayed"
		lvl = slog.LevelInfo
	}
	for _, err := range g.Refusals {
		log.Log(context.Background(), lvl, refused, append(args, "err", err)...)
	}
	if g.Applied > 0 {
		log.Info(applied, append(args, "statements", g.Applied, "revocation_version", trust.Version(), "epoch", trust.Epoch())...)
	}
}
