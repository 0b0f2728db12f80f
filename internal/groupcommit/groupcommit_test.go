package groupcommit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

var bucket = []byte("b")

func openDB(tb testing.TB) (*bbolt.DB, *atomic.Int64, func(func(*bbolt.Tx) error) error) {
	tb.Helper()
	db, err := bbolt.Open(filepath.Join(tb.TempDir(), "g.db"), 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		tb.Fatal(err)
	}
	var commits atomic.Int64
	update := func(fn func(*bbolt.Tx) error) error {
		return db.Update(func(tx *bbolt.Tx) error {
			tx.OnCommit(func() { commits.Add(1) })
			return fn(tx)
		})
	}
	return db, &commits, update
}

func put(k string) Call {
	return func(tx *bbolt.Tx) error { return tx.Bucket(bucket).Put([]byte(k), []byte("v")) }
}

var errBad = errors.New("bad call")

// A group whose transaction fails is rerun call by call: only the bad call
// fails, the others are committed.
func TestCommitAllRerunsAlone(t *testing.T) {
	db, commits, update := openDB(t)
	calls := []Call{put("a"), func(*bbolt.Tx) error { return errBad }, put("c")}
	errs := CommitAll(update, calls)
	if errs[0] != nil || !errors.Is(errs[1], errBad) || errs[2] != nil {
		t.Fatalf("errs %v", errs)
	}
	if n := commits.Load(); n != 2 {
		t.Errorf("%d commits, want 2 (a and c alone)", n)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		for _, k := range []string{"a", "c"} {
			if tx.Bucket(bucket).Get([]byte(k)) == nil {
				t.Errorf("%s not committed", k)
			}
		}
		return nil
	})
}

// Calls of one group see the writes of the calls before them.
func TestCommitAllInOrder(t *testing.T) {
	db, commits, update := openDB(t)
	incr := func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucket)
		var n uint64
		if v := b.Get([]byte("n")); v != nil {
			n = binary.BigEndian.Uint64(v)
		}
		return b.Put([]byte("n"), binary.BigEndian.AppendUint64(nil, n+1))
	}
	if errs := CommitAll(update, []Call{incr, incr, incr}); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		if n := binary.BigEndian.Uint64(tx.Bucket(bucket).Get([]byte("n"))); n != 3 || commits.Load() != 1 {
			t.Errorf("n = %d in %d commits, want 3 in 1", n, commits.Load())
		}
		return nil
	})
}

// CommitMany: one caller's calls share one commit and get their own
// errors; a bad call among them fails only itself (the rerun alone).
func TestCommitMany(t *testing.T) {
	db, commits, update := openDB(t)
	c := New(update, 2) // smaller than the batch: a batch is never split
	errs := c.CommitMany([]Call{put("a"), put("b"), put("c")})
	if errors.Join(errs...) != nil || len(errs) != 3 || commits.Load() != 1 {
		t.Fatalf("errs %v in %d commits, want 3 nil in 1", errs, commits.Load())
	}
	errs = c.CommitMany([]Call{put("d"), func(*bbolt.Tx) error { return errBad }, put("e")})
	if errs[0] != nil || !errors.Is(errs[1], errBad) || errs[2] != nil {
		t.Fatalf("errs %v", errs)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if tx.Bucket(bucket).Get([]byte(k)) == nil {
				t.Errorf("%s not committed", k)
			}
		}
		return nil
	})
}

// Concurrent callers: every Commit returns after its write is committed,
// each write exactly once, each caller's error its own; never more
// transactions than calls, and with one call per group (maxGroup 1)
// exactly as many.
func TestCommitConcurrent(t *testing.T) {
	for _, max := range []int{1, 4, DefaultMaxGroup} {
		t.Run(fmt.Sprint("max", max), func(t *testing.T) {
			db, commits, update := openDB(t)
			c := New(update, max)
			const writers, each = 16, 50
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := range each {
						k := fmt.Sprintf("w%02d-%03d", w, i)
						fn := put(k)
						if i%10 == 9 {
							fn = func(*bbolt.Tx) error { return fmt.Errorf("%s: %w", k, errBad) }
						}
						err := c.Commit(fn)
						if bad := i%10 == 9; bad != errors.Is(err, errBad) || bad && err.Error() != k+": bad call" {
							t.Errorf("%s: %v", k, err)
							return
						}
						if err == nil {
							// Committed before Commit returned.
							_ = db.View(func(tx *bbolt.Tx) error {
								if tx.Bucket(bucket).Get([]byte(k)) == nil {
									t.Errorf("%s: not visible after Commit", k)
								}
								return nil
							})
						}
					}
				})
			}
			wg.Wait()
			var keys int
			_ = db.View(func(tx *bbolt.Tx) error { keys = tx.Bucket(bucket).Stats().KeyN; return nil })
			if want := writers * each * 9 / 10; keys != want {
				t.Errorf("%d keys, want %d", keys, want)
			}
			n := commits.Load()
			if max == 1 && n != writers*each*9/10 {
				t.Errorf("maxGroup 1: %d commits for %d good calls", n, writers*each*9/10)
			}
			t.Logf("maxGroup %d: %d calls in %d commits", max, writers*each, n)
		})
	}
}

// BenchmarkCommit: calls per second through Commit, one fsync per group,
// against one bbolt Update (one fsync) per call, at 1, 8 and 64 writers.
func BenchmarkCommit(b *testing.B) {
	for _, writers := range []int{1, 8, 64} {
		for _, mode := range []string{"group", "update"} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode, writers), func(b *testing.B) {
				db, commits, update := openDB(b)
				c := New(update, 0)
				commit := c.Commit
				if mode == "update" {
					commit = func(fn Call) error { return db.Update(fn) }
				}
				var next atomic.Int64
				b.ResetTimer()
				if writers == 1 {
					for range b.N {
						if err := commit(put(fmt.Sprint(next.Add(1)))); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					// RunParallel runs GOMAXPROCS × parallelism goroutines.
					b.SetParallelism(max(1, writers/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := commit(put(fmt.Sprint(next.Add(1)))); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
				if n := commits.Load(); n > 0 && mode == "group" {
					b.ReportMetric(float64(b.N)/float64(n), "calls/commit")
				}
			})
		}
	}
}

// Riders cost no commit of their own: parked calls ride on the next
// caller's group (one commit for both), and their callback runs before
// that caller returns; without Ride the same writes take two commits.
func TestRidersJoinTheNextGroup(t *testing.T) {
	db, commits, update := openDB(t)
	c := New(update, 0)
	var got []error
	c.Ride([]Call{put("r1"), put("r2")}, func(errs []error) { got = errs })
	if n := commits.Load(); n != 0 {
		t.Fatalf("Ride committed %d times, want 0", n)
	}
	if c.Riding() != 1 {
		t.Fatalf("riding %d, want 1", c.Riding())
	}
	if err := c.Commit(put("own")); err != nil {
		t.Fatal(err)
	}
	if n := commits.Load(); n != 1 {
		t.Errorf("%d commits, want 1 (the riders with the caller's)", n)
	}
	if len(got) != 2 || got[0] != nil || got[1] != nil {
		t.Fatalf("riders' errs %v, want two nil (callback before Commit returned)", got)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		for _, k := range []string{"r1", "r2", "own"} {
			if tx.Bucket(bucket).Get([]byte(k)) == nil {
				t.Errorf("%s not committed", k)
			}
		}
		return nil
	})
	c.CommitRiders() // nothing parked: no commit
	if n := commits.Load(); n != 1 {
		t.Errorf("CommitRiders of nothing committed: %d commits", n)
	}
}

// CommitRiders returns only once the calls parked before it are
// committed, also when a group still committing took them: it waits for
// that group's callbacks (before, it returned at once, nothing being
// parked, and a flush could return before the riders it was for were
// durable).
func TestCommitRidersWaitsForGroupInProgress(t *testing.T) {
	_, _, update := openDB(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c := New(func(fn func(*bbolt.Tx) error) error {
		once.Do(func() { close(entered); <-release }) // the first commit hangs until released
		return update(fn)
	}, 0)
	var called atomic.Bool
	c.Ride([]Call{put("r")}, func([]error) { called.Store(true) })
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if err := c.Commit(put("own")); err != nil { // takes the rider, then hangs
			t.Error(err)
		}
	})
	<-entered
	flushed := make(chan bool, 1)
	wg.Go(func() {
		c.CommitRiders()
		flushed <- called.Load()
	})
	// Released a moment later: CommitRiders has (almost always) begun
	// while the group is committing. Whatever the timing, it must return
	// after the rider's callback.
	time.Sleep(50 * time.Millisecond)
	close(release)
	if !<-flushed {
		t.Error("CommitRiders returned before the rider it was called after was committed")
	}
}

// CommitRiders commits parked calls by themselves; a bad rider fails only
// itself (the group is rerun call by call), and each rider gets its own
// errors.
func TestCommitRidersAndBadRider(t *testing.T) {
	_, commits, update := openDB(t)
	c := New(update, 0)
	var a, b []error
	c.Ride([]Call{put("a")}, func(errs []error) { a = errs })
	c.Ride([]Call{func(*bbolt.Tx) error { return errBad }, put("b")}, func(errs []error) { b = errs })
	c.CommitRiders()
	if len(a) != 1 || a[0] != nil {
		t.Errorf("a: %v", a)
	}
	if len(b) != 2 || !errors.Is(b[0], errBad) || b[1] != nil {
		t.Errorf("b: %v", b)
	}
	if n := commits.Load(); n != 2 { // the failed group rolled back, then a and b alone
		t.Errorf("%d commits, want 2", n)
	}
	if c.Riding() != 0 {
		t.Errorf("still riding %d", c.Riding())
	}
}

// Concurrent riders and committers: every rider's callback runs exactly
// once, every write is committed.
func TestRidersConcurrent(t *testing.T) {
	db, _, update := openDB(t)
	c := New(update, 0)
	const n = 64
	var wg sync.WaitGroup
	var called [n]atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				c.Ride([]Call{put(fmt.Sprint("r", i))}, func(errs []error) {
					if errs[0] != nil {
						t.Error(errs[0])
					}
					called[i].Add(1)
				})
				return
			}
			if err := c.Commit(put(fmt.Sprint("c", i))); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c.CommitRiders()
	for i := 0; i < n; i += 2 {
		if v := called[i].Load(); v != 1 {
			t.Errorf("rider %d: callback ran %d times", i, v)
		}
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		if k := tx.Bucket(bucket).Stats().KeyN; k != n {
			t.Errorf("%d keys, want %d", k, n)
		}
		return nil
	})
}
