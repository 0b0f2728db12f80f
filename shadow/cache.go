package shadow

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"

	"github.com/edgefence/edgefence/fence"
)

// CacheFile is the cache's file name in the agent's state directory.
const CacheFile = "twin.db"

// DefaultCacheTimeout bounds the wait for the cache file's lock.
const DefaultCacheTimeout = time.Second

var (
	desiredBucket = []byte("twin.desired") // device → cachedDesired (JSON)
	pendingBucket = []byte("twin.pending") // device, 0, seq (8 bytes BE) → Pending (JSON)
	pseqBucket    = []byte("twin.seq")     // device → last seq handed out (8 bytes BE)
)

// CacheOptions configure a Cache. A nil *CacheOptions, and the zero value
// of each field, mean the defaults.
type CacheOptions struct {
	// Timeout bounds the wait for the file lock (default
	// DefaultCacheTimeout).
	Timeout time.Duration
	// Limits bound queued patches (as in StoreConfig).
	Limits Limits
	// Now stamps queued patches (default time.Now).
	Now func() time.Time
}

// Cache is the agent's local copy of twins for working offline: the last
// known desired state of each device (with its etcd version) and, per
// device, an ordered queue of reported patches not yet written to etcd.
// Every write is a bbolt transaction committed with fsync before it
// returns. A Cache is safe for concurrent use and starts no goroutines.
type Cache struct {
	db   *bbolt.DB
	opts CacheOptions
	// flush serializes Flush calls, so a device's queue is pushed by one
	// caller at a time, in order.
	flush sync.Mutex
}

// Pending is one queued reported patch.
type Pending struct {
	Seq   uint64         `json:"-"`
	At    time.Time      `json:"at"`
	Patch map[string]any `json:"patch"`
}

type cachedDesired struct {
	Version int64                `json:"version"`
	State   map[string]any       `json:"state"`
	Meta    map[string]FieldMeta `json:"meta,omitempty"`
}

// OpenCache opens (creating if needed) dir/twin.db.
func OpenCache(dir string, opts *CacheOptions) (*Cache, error) {
	var o CacheOptions
	if opts != nil {
		o = *opts
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultCacheTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Limits = o.Limits.withDefaults()
	path := filepath.Join(dir, CacheFile)
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.Timeout})
	if errors.Is(err, bberrors.ErrTimeout) {
		return nil, fmt.Errorf("shadow: open cache %s: not free after %v (another agent has it open?): %w", path, o.Timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("shadow: open cache %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{desiredBucket, pendingBucket, pseqBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("shadow: init cache %s: %w", path, err)
	}
	return &Cache{db: db, opts: o}, nil
}

// Close closes the file.
func (c *Cache) Close() error {
	if err := c.db.Close(); err != nil {
		return fmt.Errorf("shadow: close cache: %w", err)
	}
	return nil
}

func (c *Cache) update(fn func(*bbolt.Tx) error) error {
	err := c.db.Update(fn)
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

func (c *Cache) view(fn func(*bbolt.Tx) error) error {
	err := c.db.View(fn)
	if errors.Is(err, bberrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

func checkDev(dev string) error {
	if err := fence.ValidateDeviceID(dev); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// PutDesired records st as dev's last known desired state, unless the cache
// already holds a newer version (a watch event replayed after a full read
// must not move it back). It reports whether it stored st.
func (c *Cache) PutDesired(dev string, st State) (bool, error) {
	if err := checkDev(dev); err != nil {
		return false, err
	}
	val, err := json.Marshal(cachedDesired{Version: st.Version, State: st.Fields, Meta: st.Meta})
	if err != nil {
		return false, invalidf("encode: %v", err)
	}
	stored := false
	err = c.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(desiredBucket)
		if old := b.Get([]byte(dev)); old != nil {
			var cd cachedDesired
			if json.Unmarshal(old, &cd) == nil && cd.Version > st.Version {
				return nil
			}
		}
		stored = true
		return b.Put([]byte(dev), val)
	})
	if err != nil {
		return false, fmt.Errorf("shadow: cache desired %s: %w", dev, err)
	}
	return stored, nil
}

// Desired returns dev's last known desired state; ok is false if there is
// none.
func (c *Cache) Desired(dev string) (st State, ok bool, err error) {
	if err := checkDev(dev); err != nil {
		return State{}, false, err
	}
	err = c.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(desiredBucket).Get([]byte(dev))
		if v == nil {
			return nil
		}
		var cd cachedDesired
		if err := json.Unmarshal(v, &cd); err != nil {
			return fmt.Errorf("corrupt record: %w", err)
		}
		fields, err := Normalize(cd.State, Limits{MaxSize: max(len(v), c.opts.Limits.MaxSize), MaxDepth: c.opts.Limits.MaxDepth})
		if err != nil {
			return err
		}
		if cd.Meta == nil {
			cd.Meta = map[string]FieldMeta{}
		}
		st, ok = State{Fields: fields, Meta: cd.Meta, Version: cd.Version}, true
		return nil
	})
	if err != nil {
		return State{}, false, fmt.Errorf("shadow: cached desired %s: %w", dev, err)
	}
	return st, ok, nil
}

func pendingKey(dev string, seq uint64) []byte {
	k := make([]byte, 0, len(dev)+9)
	k = append(k, dev...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

func pendingPrefix(dev string) []byte { return append([]byte(dev), 0) }

// Enqueue appends a reported patch to dev's queue, durably (fsync) before
// it returns, and returns its sequence number. The patch is checked with
// Normalize first; a refused patch queues nothing.
func (c *Cache) Enqueue(dev string, patch map[string]any) (uint64, error) {
	if err := checkDev(dev); err != nil {
		return 0, err
	}
	p, err := Normalize(patch, c.opts.Limits)
	if err != nil {
		return 0, err
	}
	val, err := json.Marshal(Pending{At: c.opts.Now().UTC(), Patch: p})
	if err != nil {
		return 0, invalidf("encode: %v", err)
	}
	var seq uint64
	err = c.update(func(tx *bbolt.Tx) error {
		sb := tx.Bucket(pseqBucket)
		if v := sb.Get([]byte(dev)); len(v) == 8 {
			seq = binary.BigEndian.Uint64(v)
		}
		seq++
		if err := sb.Put([]byte(dev), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
			return err
		}
		return tx.Bucket(pendingBucket).Put(pendingKey(dev, seq), val)
	})
	if err != nil {
		return 0, fmt.Errorf("shadow: queue reported %s: %w", dev, err)
	}
	return seq, nil
}

// Pending returns dev's queued patches, oldest first.
func (c *Cache) Pending(dev string) ([]Pending, error) {
	if err := checkDev(dev); err != nil {
		return nil, err
	}
	var out []Pending
	err := c.view(func(tx *bbolt.Tx) error {
		pre := pendingPrefix(dev)
		cur := tx.Bucket(pendingBucket).Cursor()
		for k, v := cur.Seek(pre); k != nil && len(k) == len(pre)+8 && string(k[:len(pre)]) == string(pre); k, v = cur.Next() {
			var p Pending
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("corrupt record %x: %w", k, err)
			}
			p.Seq = binary.BigEndian.Uint64(k[len(pre):])
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("shadow: pending %s: %w", dev, err)
	}
	return out, nil
}

// PendingDevices returns the devices with queued patches, sorted.
func (c *Cache) PendingDevices() ([]string, error) {
	var out []string
	err := c.view(func(tx *bbolt.Tx) error {
		cur := tx.Bucket(pendingBucket).Cursor()
		for k, _ := cur.First(); k != nil; {
			if len(k) < 9 || k[len(k)-9] != 0 {
				return fmt.Errorf("corrupt key %x", k)
			}
			dev := string(k[:len(k)-9])
			out = append(out, dev)
			// Skip to the next device: dev, 1 sorts after every dev, 0, seq.
			k, _ = cur.Seek(append([]byte(dev), 1))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("shadow: pending devices: %w", err)
	}
	return out, nil
}

// Discard drops dev's queued patches up to and including seq (all of them
// if seq is 0).
func (c *Cache) Discard(dev string, seq uint64) error {
	if err := checkDev(dev); err != nil {
		return err
	}
	err := c.update(func(tx *bbolt.Tx) error {
		pre := pendingPrefix(dev)
		cur := tx.Bucket(pendingBucket).Cursor()
		for k, _ := cur.Seek(pre); k != nil && len(k) == len(pre)+8 && string(k[:len(pre)]) == string(pre); k, _ = cur.Seek(pre) {
			if seq != 0 && binary.BigEndian.Uint64(k[len(pre):]) > seq {
				break
			}
			if err := cur.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shadow: discard %s: %w", dev, err)
	}
	return nil
}

// FenceFunc tells Flush under which lock key and token the caller holds
// dev now; ok is false if it does not hold it.
type FenceFunc func(dev string) (lockKey string, token int64, ok bool)

// Flush pushes every device's queued patches to etcd in order, each through
// Store.UpdateReported under the lock key and token holds returns for the
// device, with the time it was queued in its metadata; a patch leaves the
// queue only once etcd has it. A device for which holds reports ok false
// is skipped (its queue stays). A device's queue stops at its first
// failure: on ErrFenced the device is listed in fenced and the queue is
// kept for the caller to Discard or push again under a new token; other
// errors (etcd unreachable, ctx) keep the queue too. err joins every
// device's error (errors.Is(err, ErrFenced) works).
//
// Not yet crash-safe (kill -9 is a later increment): a crash between
// etcd's commit and the dequeue pushes that patch again after restart.
// Alone that is harmless (merging a patch twice equals once), but if a
// newer write to the same fields landed in between, the old values come
// back.
func (c *Cache) Flush(ctx context.Context, store *Store, holds FenceFunc) (fenced []string, err error) {
	c.flush.Lock()
	defer c.flush.Unlock()
	devs, err := c.PendingDevices()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, dev := range devs {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		lockKey, token, ok := holds(dev)
		if !ok {
			continue
		}
		if err := c.flushDevice(ctx, store, dev, lockKey, token); err != nil {
			if errors.Is(err, ErrFenced) {
				fenced = append(fenced, dev)
			}
			errs = append(errs, fmt.Errorf("shadow: flush %s: %w", dev, err))
		}
	}
	return fenced, errors.Join(errs...)
}

func (c *Cache) flushDevice(ctx context.Context, store *Store, dev, lockKey string, token int64) error {
	ps, err := c.Pending(dev)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := store.updateReported(ctx, dev, p.Patch, lockKey, token, p.At); err != nil {
			return err
		}
		if err := c.update(func(tx *bbolt.Tx) error {
			return tx.Bucket(pendingBucket).Delete(pendingKey(dev, p.Seq))
		}); err != nil {
			return fmt.Errorf("dequeue %d: %w", p.Seq, err)
		}
	}
	return nil
}
