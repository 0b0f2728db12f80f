package offline_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/cputime"
	"github.com/edgefence/edgefence/offline"
)

// BenchmarkAppend measures durable appends: one fsynced bbolt commit each,
// from one goroutine, round-robin over 16 devices.
func BenchmarkAppend(b *testing.B) {
	ob := open(b, dbPath(b), &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40})
	ctx := context.Background()
	i := 0
	for b.Loop() {
		e := entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
		if err := ob.Append(ctx, e); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// BenchmarkResolve measures durable resolves (one fsynced commit each) of
// entries appended before the timer started.
func BenchmarkResolve(b *testing.B) {
	ob := open(b, dbPath(b), &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40})
	ctx := context.Background()
	var acks []*fence.Ack
	for i := range b.N {
		e := entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
		if err := ob.Append(ctx, e); err != nil {
			b.Fatal(err)
		}
		acks = append(acks, ack(e, fence.Accepted, ""))
	}
	b.ResetTimer()
	for i := range b.N {
		if err := ob.Resolve(acks[i].ID, acks[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "resolves/s")
}

// BenchmarkResolveChunk measures durable resolves (one fsynced commit
// each, from one goroutine) of entries with a 30 KiB body, a firmware
// chunk's (fwjob.MaxChunk): a window of 16 is appended with the timer
// stopped, then resolved, and so on. It reports the file's size at the end
// (file-MiB) and the part of it in pages (pages-MiB): with -benchtime Nx,
// what N resolved chunks leave in outbox.db.
func BenchmarkResolveChunk(b *testing.B) {
	const window = 16
	path := dbPath(b)
	ob := open(b, path, unbounded)
	data := make([]byte, 30<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	body, err := fence.EncodeBody(data)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var acks []*fence.Ack
	for i := 0; b.Loop(); i++ {
		if i%window == 0 {
			b.StopTimer()
			acks = acks[:0]
			for j := i; j < i+window; j++ {
				e := entry(fmt.Sprintf("dev-%d", j%4), fmt.Sprintf("c-%d", j), 1, uint64(j+1))
				e.Envelope.Body = body
				if err := ob.Append(ctx, e); err != nil {
					b.Fatal(err)
				}
				acks = append(acks, ack(e, fence.Accepted, ""))
			}
			b.StartTimer()
		}
		a := acks[i%window]
		if err := ob.Resolve(a.ID, a); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "resolves/s")
	ob.Close()
	size, pages := fileSize(b, path)
	b.ReportMetric(float64(size)/(1<<20), "file-MiB")
	b.ReportMetric(float64(pages)/(1<<20), "pages-MiB")
}

// unbounded lifts the outbox's limits for benchmarks that queue a lot.
var unbounded = &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40}

// BenchmarkDurable compares the outbox's durable operations with raw bbolt
// on the same disk in the same run: each operation of both is one fsynced
// commit from one goroutine.
//
//   - append: Append, against one db.Update that Puts a value of the
//     record's size;
//   - append+resolve: a command's whole life in the outbox (Append, then
//     Resolve with an ack: two commits), against two such Updates (also
//     with bbolt's NoFreelistSync and hashmap freelist), with the CPU per
//     command.
func BenchmarkDurable(b *testing.B) {
	ctx := context.Background()
	b.Run("append/outbox", func(b *testing.B) {
		ob := open(b, dbPath(b), unbounded)
		i := 0
		for b.Loop() {
			if err := ob.Append(ctx, entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
	})
	b.Run("append/raw-bbolt", func(b *testing.B) {
		db := rawDB(b)
		i := 0
		for b.Loop() {
			rawPut(b, db, i)
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
	})
	b.Run("append+resolve/outbox", func(b *testing.B) {
		ob := open(b, dbPath(b), unbounded)
		i := 0
		cpu0 := cputime.Process()
		for b.Loop() {
			e := entry(fmt.Sprintf("dev-%d", i%16), fmt.Sprintf("c-%d", i), 1, uint64(i+1))
			if err := ob.Append(ctx, e); err != nil {
				b.Fatal(err)
			}
			if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
				b.Fatal(err)
			}
			i++
		}
		reportCommands(b, cpu0)
	})
	for _, v := range []struct {
		name string
		opts bbolt.Options
	}{{"raw-bbolt", bbolt.Options{}}, {"raw-bbolt-nofreelistsync", bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}}} {
		b.Run("append+resolve/"+v.name, func(b *testing.B) {
			db := rawDBWith(b, v.opts)
			i := 0
			cpu0 := cputime.Process()
			for b.Loop() {
				rawPut(b, db, i)
				rawPut(b, db, i) // the resolve rewrites the record
				i++
			}
			reportCommands(b, cpu0)
		})
	}
}

// reportCommands reports an append+resolve benchmark's commands and
// commits a second and this process's user+sys CPU per command since
// cpu0 (cpu-µs/cmd: the durable floor of a command's CPU in the agent,
// BENCHMARKS "CPU per command").
func reportCommands(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "commits/s")
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/cmd")
}

func rawDB(b *testing.B) *bbolt.DB { return rawDBWith(b, bbolt.Options{}) }

func rawDBWith(b *testing.B, opts bbolt.Options) *bbolt.DB {
	opts.Timeout = time.Second
	db, err := bbolt.Open(dbPath(b), 0o600, &opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("raw")); return err }); err != nil {
		b.Fatal(err)
	}
	return db
}

// rawValue is about the size of a stored outbox record (a 44-byte header
// around a ~50-byte envelope).
var rawValue = make([]byte, 96)

func rawPut(b *testing.B, db *bbolt.DB, i int) {
	err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("raw")).Put([]byte(fmt.Sprintf("c-%d", i)), rawValue)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// backlog is an outbox file with backlogSize pending commands over
// backlogDevices devices, built once (≈ 2.5 s of fsynced appends) and
// copied for every replay.
const (
	backlogSize    = 10_000
	backlogDevices = 16
)

var backlog struct {
	once sync.Once
	path string
	err  error
}

func backlogFile(b *testing.B) string {
	backlog.once.Do(func() {
		dir, err := os.MkdirTemp("", "outbox-backlog-")
		if err != nil {
			backlog.err = err
			return
		}
		backlog.path = filepath.Join(dir, offline.File)
		ob, err := offline.Open(backlog.path, unbounded)
		if err != nil {
			backlog.err = err
			return
		}
		defer ob.Close()
		for i := range backlogSize {
			e := entry(fmt.Sprintf("dev-%02d", i%backlogDevices), fmt.Sprintf("c-%05d", i), 1, uint64(i/backlogDevices+1))
			if backlog.err = ob.Append(context.Background(), e); backlog.err != nil {
				return
			}
		}
	})
	if backlog.err != nil {
		b.Fatal(backlog.err)
	}
	return backlog.path
}

// BenchmarkReplay measures the replay of a 10,000-command backlog (16
// devices × 625): the outbox is reopened, then every device's queue is
// drained the way the agent's delivery does it — Next, (send), Resolve
// with the ack — round-robin over the devices until every queue is empty.
// One op is the whole backlog; the rate is reported as commands/s. Open
// (which counts the pending entries) is timed separately as open-ms.
//
// resolve-concurrent: the acks of one round (one per device, 16) are
// recorded by 16 concurrent Resolve calls, as the agent's device workers
// do: they share commits (group commit).
func BenchmarkReplay(b *testing.B) {
	b.Run("resolve", func(b *testing.B) { benchReplay(b, false) })
	b.Run("resolve-concurrent", func(b *testing.B) { benchReplay(b, true) })
}

func benchReplay(b *testing.B, many bool) {
	src := backlogFile(b)
	raw, err := os.ReadFile(src)
	if err != nil {
		b.Fatal(err)
	}
	var openTime time.Duration
	for range b.N {
		b.StopTimer()
		path := dbPath(b)
		if err := writeSynced(path, raw); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		ob, err := offline.Open(path, unbounded)
		if err != nil {
			b.Fatal(err)
		}
		openTime += time.Since(t0)
		n := 0
		for devs := ob.Devices(); len(devs) > 0; devs = ob.Devices() {
			var acks []*fence.Ack
			for _, d := range devs {
				e, ok, err := ob.Next(d)
				if err != nil || !ok {
					b.Fatal(d, ok, err)
				}
				n++
				if many {
					acks = append(acks, ack(e, fence.Accepted, ""))
					continue
				}
				if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
					b.Fatal(err)
				}
			}
			if many {
				errs := make([]error, len(acks))
				var wg sync.WaitGroup
				for i, a := range acks {
					wg.Go(func() { errs[i] = ob.Resolve(a.ID, a) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StopTimer()
		ob.Close()
		if n != backlogSize {
			b.Fatalf("replayed %d commands, want %d", n, backlogSize)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(backlogSize*b.N)/b.Elapsed().Seconds(), "commands/s")
	b.ReportMetric(float64(openTime.Milliseconds())/float64(b.N), "open-ms")
}

// writeSynced writes a copy of the backlog, flushed to disk so that the
// replay's first commit does not pay for it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// BenchmarkReplayRawBolt is BenchmarkReplay's baseline: raw bbolt with the
// same shape — 10,000 records of the outbox's size in one bucket, their
// queue keys in a second, written one commit each and replayed from a
// synced copy — and per command one read of the queue head and one
// fsynced Update doing what Resolve does (rewrite the record, delete the
// queue key, put a done key).
func BenchmarkReplayRawBolt(b *testing.B) {
	entries, queue, done := []byte("e"), []byte("q"), []byte("d")
	for range b.N {
		b.StopTimer()
		db, err := bbolt.Open(dbPath(b), 0o600, &bbolt.Options{Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		// The backlog, one commit per command like the outbox's (the same
		// page layout), without fsync: building it is not measured.
		db.NoSync = true
		err = db.Update(func(tx *bbolt.Tx) error {
			for _, name := range [][]byte{entries, queue, done} {
				if _, err := tx.CreateBucket(name); err != nil {
					return err
				}
			}
			return nil
		})
		for i := 0; i < backlogSize && err == nil; i++ {
			err = db.Update(func(tx *bbolt.Tx) error {
				id := []byte(fmt.Sprintf("c-%05d", i))
				if err := tx.Bucket(entries).Put(id, make([]byte, 140)); err != nil {
					return err
				}
				return tx.Bucket(queue).Put([]byte(fmt.Sprintf("dev-%02d\x00%08d", i%backlogDevices, i/backlogDevices)), id)
			})
		}
		if err != nil {
			b.Fatal(err)
		}
		// Replay a synced copy of it, like BenchmarkReplay.
		built := db.Path()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		raw, err := os.ReadFile(built)
		if err != nil {
			b.Fatal(err)
		}
		path := dbPath(b)
		if err := writeSynced(path, raw); err != nil {
			b.Fatal(err)
		}
		if db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for n := 0; n < backlogSize; {
			for d := range backlogDevices {
				var k, id []byte
				db.View(func(tx *bbolt.Tx) error {
					prefix := []byte(fmt.Sprintf("dev-%02d\x00", d))
					k, id = tx.Bucket(queue).Cursor().Seek(prefix)
					k, id = append([]byte(nil), k...), append([]byte(nil), id...)
					return nil
				})
				err := db.Update(func(tx *bbolt.Tx) error {
					if err := tx.Bucket(entries).Put(id, make([]byte, 240)); err != nil {
						return err
					}
					if err := tx.Bucket(queue).Delete(k); err != nil {
						return err
					}
					return tx.Bucket(done).Put(append([]byte("00000000"), id...), nil)
				})
				if err != nil {
					b.Fatal(err)
				}
				n++
			}
		}
		b.StopTimer()
		db.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(backlogSize*b.N)/b.Elapsed().Seconds(), "commands/s")
}

// BenchmarkNextChunk: a delivery worker's read of its next entry when it
// is a 30 KiB firmware chunk (a bbolt read, the envelope's decode and
// copy): on the worker's path between one chunk's ack and the next send.
func BenchmarkNextChunk(b *testing.B) {
	ob, err := offline.Open(filepath.Join(b.TempDir(), offline.File), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ob.Close()
	body := append([]byte{0x59, 0x78, 0x00}, make([]byte, 30<<10)...) // CBOR bytes(30720)
	e := &offline.Entry{Envelope: fence.Envelope{V: fence.Version, Device: "d", Token: 1, Seq: 1, ID: "c1", Kind: "fw.chunk", Body: body}}
	if err := ob.Append(context.Background(), e); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, ok, err := ob.NextAfter("d", 0); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkConcurrentAppend: N goroutines (1, 8, 64) each appending one
// entry at a time (Append: durable before it returns), round-robin over
// 1,024 devices, against raw bbolt's DB.Batch doing one Put of a
// record-sized value per call from as many goroutines, in the same run.
// Reported: appends/s and appends/commit (the commits counted by
// ObserveCommits for the outbox, by distinct transaction ids for Batch).
func BenchmarkConcurrentAppend(b *testing.B) {
	for _, writers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("outbox/writers=%d", writers), func(b *testing.B) {
			ob := open(b, dbPath(b), unbounded)
			var commits atomic.Int64
			ob.ObserveCommits(func(time.Duration) { commits.Add(1) })
			var next atomic.Int64
			ctx := context.Background()
			runWriters(b, writers, func() error {
				i := next.Add(1)
				return ob.Append(ctx, entry(fmt.Sprintf("dev-%d", i%1024), fmt.Sprintf("c-%d", i), 1, uint64(i)))
			})
			reportCommits(b, commits.Load())
		})
		b.Run(fmt.Sprintf("raw-bbolt-batch/writers=%d", writers), func(b *testing.B) {
			db := rawDB(b)
			var mu sync.Mutex
			txs := map[int]bool{}
			var next atomic.Int64
			runWriters(b, writers, func() error {
				i := next.Add(1)
				return db.Batch(func(tx *bbolt.Tx) error {
					mu.Lock()
					txs[tx.ID()] = true
					mu.Unlock()
					return tx.Bucket([]byte("raw")).Put([]byte(fmt.Sprintf("c-%d", i)), rawValue)
				})
			})
			reportCommits(b, int64(len(txs)))
		})
	}
}

// runWriters calls op b.N times from writers goroutines in all.
func runWriters(b *testing.B, writers int, op func() error) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	for range writers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
}

func reportCommits(b *testing.B, commits int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	if commits > 0 {
		b.ReportMetric(float64(b.N)/float64(commits), "appends/commit")
	}
}

// BenchmarkExpireNoneDue measures one expiry pass (ExpireDue; the agent
// runs one a second) over n pending entries of 1,000 devices, none past
// its TTL: the time it holds the outbox's lock.
//
//	go test -run '^$' -bench ExpireNoneDue -benchtime 20x ./offline/
func BenchmarkExpireNoneDue(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ob := open(b, dbPath(b), &offline.Options{MaxTotal: 1 << 30, MaxPerDevice: 1 << 30, MaxTotalBytes: 1 << 40, MaxBytesPerDevice: 1 << 40})
			ctx := context.Background()
			for i := 0; i < n; i += 1000 {
				es := make([]*offline.Entry, 0, 1000)
				for j := i; j < i+1000; j++ {
					es = append(es, entry(fmt.Sprintf("dev-%d", j%1000), fmt.Sprintf("c-%d", j), 1, uint64(j/1000+1)))
				}
				if err := ob.AppendAll(ctx, es); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if k, err := ob.ExpireDue(); err != nil || k != 0 {
					b.Fatal(k, err)
				}
			}
		})
	}
}

// BenchmarkEndedFileBytes is the outbox file a kept ended command costs:
// appended and resolved (accepted) one after the other, as the agent's
// commands end, a {"setpoint": 22.5} body and a 32-character id, over 16
// devices;
// the file's size over the commands ended, under the default MaxEnded
// (100,000: not reached with -benchtime below it) and under 10,000.
func BenchmarkEndedFileBytes(b *testing.B) {
	for _, maxEnded := range []int{0, 10_000} { // 0: the default, 100,000
		b.Run(fmt.Sprintf("max_ended=%d", maxEnded), func(b *testing.B) {
			path := dbPath(b)
			ob := open(b, path, &offline.Options{MaxEnded: maxEnded})
			body, err := fence.EncodeBody(map[string]any{"setpoint": 22.5})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			i := 0
			for b.Loop() {
				e := entry(fmt.Sprintf("rss-%04d", i%16), fmt.Sprintf("%032x", i), 1, uint64(i+1))
				e.Envelope.Body = body
				if err := ob.Append(ctx, e); err != nil {
					b.Fatal(err)
				}
				if err := ob.Resolve(e.Envelope.ID, ack(e, fence.Accepted, "")); err != nil {
					b.Fatal(err)
				}
				if ob.EndedOver() {
					if _, err := ob.Compact(); err != nil {
						b.Fatal(err)
					}
				}
				i++
			}
			fi, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(fi.Size())/float64(b.N), "file-B/command")
			b.ReportMetric(float64(fi.Size())/(1<<20), "file-MiB")
			b.ReportMetric(float64(ob.Ended()), "ended-kept")
		})
	}
}

// BenchmarkCommandIDs is what the command id's order costs the outbox in
// a fan-out: a batch of 1,000 commands (a device each, a
// {"setpoint": 22.5} body) appended in one AppendAll and resolved in one
// ResolveAll (two fsynced commits), with ids of 16 random bytes (the
// agent's before NewCommandID) and with NewCommandID's, on an outbox with
// no ended commands kept and with 50,000 (half the default MaxEnded). It
// reports the CPU a command and the file's size over the commands in it.
func BenchmarkCommandIDs(b *testing.B) {
	random := func() string {
		var x [16]byte
		_, _ = rand.Read(x[:])
		return hex.EncodeToString(x[:])
	}
	ordered := func() string { return offline.NewCommandID(time.Now()) }
	body, err := fence.EncodeBody(map[string]any{"setpoint": 22.5})
	if err != nil {
		b.Fatal(err)
	}
	for _, kept := range []int{0, 50_000} {
		for _, ids := range []struct {
			name string
			id   func() string
		}{{"random", random}, {"NewCommandID", ordered}} {
			b.Run(fmt.Sprintf("ended=%d/ids=%s", kept, ids.name), func(b *testing.B) {
				path := dbPath(b)
				ob := open(b, path, unbounded)
				fan := newFanBatch(b, ob, 1000, body, ids.id)
				for range kept / 1000 {
					fan.run()
				}
				cpu0 := cputime.Process()
				for b.Loop() {
					fan.run()
				}
				b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N*1000)/float64(time.Microsecond), "cpu-µs/command")
				fi, err := os.Stat(path)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(fi.Size())/float64(kept+b.N*1000), "file-B/command")
			})
		}
	}
}

// fanBatch appends and resolves a command to each of n devices, as a
// fan-out does.
type fanBatch struct {
	b    *testing.B
	ob   *offline.Outbox
	n    int
	seq  uint64
	body []byte
	id   func() string
}

func newFanBatch(b *testing.B, ob *offline.Outbox, n int, body []byte, id func() string) *fanBatch {
	return &fanBatch{b: b, ob: ob, n: n, body: body, id: id}
}

func (f *fanBatch) run() {
	f.seq++
	es := make([]*offline.Entry, f.n)
	for i := range es {
		es[i] = entry(fmt.Sprintf("dev-%05d", i), f.id(), 1, f.seq)
		es[i].Envelope.Body = f.body
	}
	if err := f.ob.AppendAll(context.Background(), es); err != nil {
		f.b.Fatal(err)
	}
	acks := make([]*fence.Ack, f.n)
	for i, e := range es {
		acks[i] = ack(e, fence.Accepted, "")
	}
	for _, err := range f.ob.ResolveAll(acks) {
		if err != nil {
			f.b.Fatal(err)
		}
	}
}
