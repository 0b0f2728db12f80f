package fence_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
)

// The benchmarks below measure durable admits per second through
// fence.Table and, beside them in the same run, raw bbolt doing the least
// the table must do: read one key and write it back, with one Update per put
// or through Batch (MaxBatchSize 16, MaxBatchDelay 1 ms, the settings the
// table used before its timer-free group commit). The targets:
// group-commit admits ≥ 0.8× raw Batch puts, fsync-per-admit ≥ 0.9× raw
// fsync-per-Update. Every admit and every put is committed with fsync.
//
//	go test -run '^$' -bench 'Table|RawBolt' -benchtime 2s ./fence/

// benchConcs are the numbers of devices admitting at the same time.
var benchConcs = []int{1, 2, 8, 16, 64, 256}

func BenchmarkTable(b *testing.B) {
	b.Run("fsync/conc=1", func(b *testing.B) {
		benchTable(b, &fence.TableOptions{NoGroupCommit: true}, 1)
	})
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("groupcommit/conc=%d", conc), func(b *testing.B) {
			benchTable(b, nil, conc)
		})
	}
}

// BenchmarkTableApplied measures what the gateway bridge does per
// command: Admit, then, once the device answered, MarkApplied, whose
// removal rides along with the device's next admit; the previous
// command's AwaitApplied comes before each command goes on the wire.
// (BenchmarkTable admits only, so its unapplied list grows for the whole
// run.)
func BenchmarkTableApplied(b *testing.B) {
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("groupcommit/conc=%d", conc), func(b *testing.B) {
			benchTableApplied(b, conc)
		})
	}
}

func benchTableApplied(b *testing.B, conc int) {
	tab, err := fence.OpenTable(filepath.Join(b.TempDir(), fence.TableFile), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tab.Close()
	envs := make([]*fence.Envelope, conc)
	tickets := make([]uint64, conc)
	for g := range envs {
		envs[g] = &fence.Envelope{V: fence.Version, Device: fmt.Sprintf("dev-%04d", g), Token: 1 << 20,
			ID: fmt.Sprintf("cmd-%04d", g), Kind: "set", Holder: "gw-1"}
	}
	ctx := context.Background()
	runConcurrent(b, conc, func(g int) error {
		env := *envs[g]
		envs[g].Seq++
		env.Seq = envs[g].Seq
		v, m, err := tab.Admit(ctx, &env)
		if err == nil && v != fence.Accepted {
			err = fmt.Errorf("%s seq %d: %v", env.Device, env.Seq, v)
		}
		if err == nil && tickets[g] != 0 { // the previous command's mark, before this one's wire
			err = tab.AwaitApplied(ctx, tickets[g])
		}
		if err == nil {
			tickets[g], err = tab.MarkApplied(env.Device, m)
		}
		return err
	})
}

func BenchmarkRawBolt(b *testing.B) {
	b.Run("update/conc=1", func(b *testing.B) {
		benchRaw(b, (*bbolt.DB).Update, 1)
	})
	for _, conc := range benchConcs {
		b.Run(fmt.Sprintf("batch/conc=%d", conc), func(b *testing.B) {
			benchRaw(b, (*bbolt.DB).Batch, conc)
		})
	}
}

// BenchmarkGroupCommit compares, in one run, the table's own group commit
// with bbolt's DB.Batch doing the same work (Table.AdmitBatch, test-only:
// the same cache check, decision, mark and unapplied command in the
// transaction) at several MaxBatchDelay and MaxBatchSize settings. A delay
// of 0 is bbolt's "no batching": an Update per admit. Every commit fsyncs.
//
//	go test -run '^$' -bench GroupCommit -benchtime 2s -count 5 ./fence/
func BenchmarkGroupCommit(b *testing.B) {
	for _, conc := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("conc=%d/table", conc), func(b *testing.B) {
			benchTable(b, nil, conc)
		})
		for _, s := range []struct {
			delay time.Duration
			size  int
		}{
			{0, 0},
			{20 * time.Microsecond, 64},
			{100 * time.Microsecond, 64},
			{500 * time.Microsecond, 64},
			{100 * time.Microsecond, 8},
			{10 * time.Millisecond, 1000}, // bbolt's defaults
		} {
			b.Run(fmt.Sprintf("conc=%d/batch/delay=%v/size=%d", conc, s.delay, s.size), func(b *testing.B) {
				benchAdmits(b, conc, func(tab *fence.Table) admitFunc {
					tab.SetBatch(s.delay, s.size)
					return tab.AdmitBatch
				})
			})
		}
	}
}

type admitFunc func(context.Context, *fence.Envelope) (fence.Verdict, fence.Mark, error)

// benchTable admits b.N commands from conc goroutines, one device each,
// each with the next seq of its device.
func benchTable(b *testing.B, opts *fence.TableOptions, conc int) {
	benchAdmitsOpts(b, opts, conc, func(tab *fence.Table) admitFunc { return tab.Admit })
}

// benchAdmits is benchTable admitting through the function with returns.
func benchAdmits(b *testing.B, conc int, with func(*fence.Table) admitFunc) {
	benchAdmitsOpts(b, nil, conc, with)
}

func benchAdmitsOpts(b *testing.B, opts *fence.TableOptions, conc int, with func(*fence.Table) admitFunc) {
	tab, err := fence.OpenTable(filepath.Join(b.TempDir(), fence.TableFile), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer tab.Close()
	admit := with(tab)
	envs := make([]*fence.Envelope, conc)
	for g := range envs {
		envs[g] = &fence.Envelope{V: fence.Version, Device: fmt.Sprintf("dev-%04d", g), Token: 1 << 20,
			ID: fmt.Sprintf("cmd-%04d", g), Kind: "set", Holder: "gw-1"}
	}
	ctx := context.Background()
	runConcurrent(b, conc, func(g int) error {
		env := *envs[g] // a copy: the seq is the goroutine's own
		envs[g].Seq++
		env.Seq = envs[g].Seq
		v, _, err := admit(ctx, &env)
		if err == nil && v != fence.Accepted {
			err = fmt.Errorf("%s seq %d: %v", env.Device, env.Seq, v)
		}
		return err
	})
}

// benchRaw does what benchTable does with bbolt alone: per command, one
// transaction function (run by Update or Batch) that reads the device's key
// and writes a value of a table record's size.
func benchRaw(b *testing.B, commit func(*bbolt.DB, func(*bbolt.Tx) error) error, conc int) {
	db, err := bbolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	// The settings the table used before its own group commit.
	db.MaxBatchSize = 16
	db.MaxBatchDelay = time.Millisecond
	bucket := []byte("raw")
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(bucket)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	keys := make([][]byte, conc)
	for g := range keys {
		keys[g] = fmt.Appendf(nil, "dev-%04d", g)
	}
	val := make([]byte, 43) // a record with holder "gw-1" and id "cmd-0000"
	runConcurrent(b, conc, func(g int) error {
		return commit(db, func(tx *bbolt.Tx) error {
			bk := tx.Bucket(bucket)
			_ = bk.Get(keys[g])
			return bk.Put(keys[g], val)
		})
	})
}

// runConcurrent calls op b.N times in all from conc goroutines (g is the
// goroutine's number) and reports the rate as admits/s.
func runConcurrent(b *testing.B, conc int, op func(g int) error) {
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	b.ResetTimer()
	for g := range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(g); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admits/s")
}
