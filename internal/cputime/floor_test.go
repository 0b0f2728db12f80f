package cputime

// What this machine charges, in CPU, for the parts every command of the
// agent is made of: waking an idle process, a request→reply over a
// loopback socket, a durable write, a bbolt commit. They bound from below
// what a command sent one at a time can cost (docs/BENCHMARKS.md, "The
// floor of a command"):
//
//	go test -run '^$' -bench Floor -benchtime 2000x ./internal/cputime/
//
// Each reports cpu-µs/op, this process's user + system CPU per operation
// (Process), beside Go's wall-clock ns/op.

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// reportCPU reports the CPU spent since c0 per operation.
func reportCPU(b *testing.B, c0 time.Duration) {
	b.ReportMetric(float64(Process()-c0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// BenchmarkFloorWake: the process idles 1 ms on a timer and wakes, once
// per op — what every event costs a process that is idle between
// commands (the scheduler parks its threads, the kernel wakes one).
func BenchmarkFloorWake(b *testing.B) {
	c0 := Process()
	for b.Loop() {
		time.Sleep(time.Millisecond)
	}
	reportCPU(b, c0)
}

// BenchmarkFloorLoopbackExchange: a 100-byte request and a 100-byte reply
// over loopback TCP between two goroutines of this process (both ends
// counted), back to back ("busy") or after 1 ms of idling ("idle", the
// wake included) — the shape of an API call, or of a publish and its ack
// through a broker (which is two such hops).
func BenchmarkFloorLoopbackExchange(b *testing.B) {
	for _, gap := range []struct {
		name string
		d    time.Duration
	}{{"busy", 0}, {"idle", time.Millisecond}} {
		b.Run(gap.name, func(b *testing.B) {
			cli, stop := echoPair(b)
			defer stop()
			req, resp := make([]byte, 100), make([]byte, 100)
			c0 := Process()
			for b.Loop() {
				if gap.d > 0 {
					time.Sleep(gap.d)
				}
				if _, err := cli.Write(req); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(cli, resp); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, c0)
		})
	}
}

// echoPair is a loopback TCP connection whose other end echoes 100-byte
// messages from its own goroutine.
func echoPair(b *testing.B) (net.Conn, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	return cli, func() { cli.Close(); ln.Close(); <-done }
}

// BenchmarkFloorFdatasync: a 4 KiB overwrite and fdatasync of a
// preallocated file — the least a durable write costs.
func BenchmarkFloorFdatasync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	page := make([]byte, 4096)
	c0 := Process()
	i := 0
	for b.Loop() {
		if _, err := f.WriteAt(page, int64(i%256)*4096); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		i++
	}
	reportCPU(b, c0)
}

// BenchmarkFloorBboltCommit: one durable bbolt commit (two fdatasyncs: the
// pages, then the meta page) in a file already holding 10,000 records of
// 200 bytes, as a working outbox: a put in one bucket, and puts in four
// buckets as the outbox's append makes (entries, queue, seq, issued); the
// last with bbolt's options that cut a commit's writes.
func BenchmarkFloorBboltCommit(b *testing.B) {
	for _, v := range []struct {
		name string
		nb   int
		opts *bbolt.Options
	}{
		{"1bucket", 1, nil}, {"4buckets", 4, nil},
		// bbolt's knobs against the commit's cost: no freelist page
		// written per commit, and a mapping that never grows here.
		{"4buckets-tuned", 4, &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, InitialMmapSize: 64 << 20}},
	} {
		nb := v.nb
		b.Run(v.name, func(b *testing.B) {
			db, err := bbolt.Open(filepath.Join(b.TempDir(), "db"), 0o600, v.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			names := [][]byte{[]byte("entries"), []byte("queue"), []byte("seq"), []byte("issued")}[:nb]
			val := make([]byte, 200)
			put := func(tx *bbolt.Tx, k uint64) error {
				key := binary.BigEndian.AppendUint64(nil, k)
				for _, n := range names {
					bk, err := tx.CreateBucketIfNotExists(n)
					if err != nil {
						return err
					}
					if err := bk.Put(key, val); err != nil {
						return err
					}
				}
				return nil
			}
			if err := db.Update(func(tx *bbolt.Tx) error {
				for k := range uint64(10_000) {
					if err := put(tx, k); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			c0 := Process()
			k := uint64(10_000)
			for b.Loop() {
				k++
				if err := db.Update(func(tx *bbolt.Tx) error { return put(tx, k) }); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, c0)
		})
	}
}
