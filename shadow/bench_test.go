package shadow_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/edgefence/edgefence/shadow"
)

// thermostat is a realistic twin: ~40 fields, nested settings, a weekly
// schedule as an array (≈1.5 KB of JSON).
func thermostat(tb testing.TB, temp float64) map[string]any {
	tb.Helper()
	sched := make([]any, 0, 7)
	for d := range 7 {
		sched = append(sched, map[string]any{"day": d, "slots": []any{
			map[string]any{"from": "06:30", "to": "08:00", "temp": 21},
			map[string]any{"from": "17:00", "to": "22:30", "temp": 21.5},
		}})
	}
	m := map[string]any{
		"temp": temp, "humidity": 41.5, "mode": "heat", "fan": "auto", "on": true,
		"fw":       map[string]any{"version": "2.4.1", "channel": "stable", "build": 20260301},
		"net":      map[string]any{"rssi": -61, "ip": "10.0.3.17", "ssid": "plant-3", "uptime_s": 86400},
		"limits":   map[string]any{"min": 5, "max": 28, "step": 0.5, "lock": false},
		"eco":      map[string]any{"enabled": true, "setback": 3, "window_open_detect": true},
		"schedule": sched,
		"alarms":   []any{"filter"},
	}
	for i := range 20 {
		m[fmt.Sprintf("sensor_%02d", i)] = float64(i) * 1.25
	}
	n, err := shadow.Normalize(m, shadow.Limits{})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func BenchmarkMerge(b *testing.B) {
	doc := thermostat(b, 20)
	patch := map[string]any{"temp": 21.0, "eco": map[string]any{"setback": 2.0}, "alarms": nil}
	b.ReportAllocs()
	for b.Loop() {
		_ = shadow.Merge(doc, patch)
	}
}

func BenchmarkDelta(b *testing.B) {
	des, rep := thermostat(b, 21), thermostat(b, 20)
	b.ReportAllocs()
	for b.Loop() {
		if d := shadow.Delta(des, rep); len(d) != 1 {
			b.Fatal(d)
		}
	}
}

func BenchmarkApplyPatch(b *testing.B) {
	st := shadow.State{Fields: thermostat(b, 20)}
	m := shadow.FieldMeta{At: time.Now(), By: "gw-a", Token: 42}
	st, err := shadow.ApplyPatch(shadow.State{}, st.Fields, m, shadow.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	patch := map[string]any{"temp": 21.0, "net": map[string]any{"rssi": -60}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := shadow.ApplyPatch(st, patch, m, shadow.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeCBOR(b *testing.B) {
	doc := thermostat(b, 20)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := shadow.EncodeCBOR(doc, shadow.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateReported is the fenced reported write by the holder, on a
// realistic document, round trip to the embedded etcd (fsync included),
// and the etcd requests it costs.
func BenchmarkUpdateReported(b *testing.B) {
	cli := newClient(b)
	ctx := context.Background()
	st := newStore(b, cli.Client, newPrefix(), "gw-a")
	h := lockDevice(b, cli.Client, st, "d1")
	if _, err := st.UpdateReported(ctx, "d1", thermostat(b, 20), h.key, h.token); err != nil {
		b.Fatal(err)
	}
	start := cli.reqs.Load()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if _, err := st.UpdateReported(ctx, "d1", map[string]any{"temp": float64(i % 30)}, h.key, h.token); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cli.reqs.Load()-start)/float64(b.N), "etcd-req/op")
}

// BenchmarkDesiredWatchLatency measures desired put → watch event, beside a
// bare etcd put → watch event on the same server.
func BenchmarkDesiredWatchLatency(b *testing.B) {
	cli := newClient(b)
	st := newStore(b, cli.Client, newPrefix(), "app")
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan shadow.Event, 1)
	done := make(chan error, 1)
	go func() {
		done <- st.Watch(ctx, "d1", rev(b, cli.Client)+1, func(ev shadow.Event) error {
			events <- ev
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	doc := thermostat(b, 20)
	if _, err := st.UpdateDesiredAny(ctx, "d1", doc); err != nil {
		b.Fatal(err)
	}
	<-events
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		t0 := time.Now()
		if _, err := st.UpdateDesiredAny(ctx, "d1", map[string]any{"temp": float64(i % 30)}); err != nil {
			b.Fatal(err)
		}
		<-events
		lat = append(lat, time.Since(t0))
	}
	report(b, lat, "twin")

	// Bare etcd put → watch event.
	key := "/shadowtest/bare"
	wch := cli.Watch(ctx, key)
	var bare []time.Duration
	for j := range len(lat) {
		t0 := time.Now()
		if _, err := cli.Put(ctx, key, fmt.Sprint(j)); err != nil {
			b.Fatal(err)
		}
		<-wch
		bare = append(bare, time.Since(t0))
	}
	report(b, bare, "bare")
}

func report(b *testing.B, lat []time.Duration, name string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), name+"-p50-µs")
	b.ReportMetric(q(0.99), name+"-p99-µs")
}
