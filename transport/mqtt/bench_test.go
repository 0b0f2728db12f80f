package mqtt

import (
	"context"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// BenchmarkRoundTrip is the bare paho round trip the project compares
// against: one client publishes a 37-byte QoS 1 message, another receives
// it, sequentially, through an in-process mochi broker. The latency is from
// the start of Publish to the subscriber's handler; each iteration also
// waits for Publish to return (PUBACK) before the next one starts.
//
//	go test -run '^$' -bench RoundTrip -benchtime 10000x ./transport/mqtt/
func BenchmarkRoundTrip(b *testing.B) {
	br := startBroker(b)
	recv := make(chan time.Time, 1)
	quiet := func(c *Config) { c.Logger = nil }
	sub := dial(b, br.url(), "bench-sub", quiet)
	sub.Subscribe("bench/rt", func(Message) { recv <- time.Now() })
	pub := dial(b, br.url(), "bench-pub", quiet)
	ctx := context.Background()
	if err := sub.AwaitSubscribed(timeout(b, 5*time.Second)); err != nil {
		b.Fatal(err)
	}
	if err := pub.AwaitConnection(timeout(b, 5*time.Second)); err != nil {
		b.Fatal(err)
	}
	m := Message{Topic: "bench/rt", Payload: make([]byte, 37)}
	lat := make([]time.Duration, 0, b.N)

	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := pub.Publish(ctx, m); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-recv).Sub(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// BenchmarkRoundTripAutopaho is BenchmarkRoundTrip with autopaho used
// directly (no Client): the difference is this package's overhead.
func BenchmarkRoundTripAutopaho(b *testing.B) {
	br := startBroker(b)
	u, err := url.Parse(br.url())
	if err != nil {
		b.Fatal(err)
	}
	recv := make(chan time.Time, 1)
	ctx := context.Background()
	connect := func(id string, onMsg func(paho.PublishReceived) (bool, error)) *autopaho.ConnectionManager {
		cfg := autopaho.ClientConfig{
			ServerUrls: []*url.URL{u},
			KeepAlive:  30,
			ClientConfig: paho.ClientConfig{
				ClientID: id,
			},
		}
		if onMsg != nil {
			cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onMsg}
		}
		cm, err := autopaho.NewConnection(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cm.Disconnect(context.Background()) })
		if err := cm.AwaitConnection(timeout(b, 5*time.Second)); err != nil {
			b.Fatal(err)
		}
		return cm
	}
	sub := connect("bare-sub", func(paho.PublishReceived) (bool, error) { recv <- time.Now(); return true, nil })
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "bench/rt", QoS: 1}}}); err != nil {
		b.Fatal(err)
	}
	pub := connect("bare-pub", nil)
	payload := make([]byte, 37)
	lat := make([]time.Duration, 0, b.N)

	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := pub.Publish(ctx, &paho.Publish{QoS: 1, Topic: "bench/rt", Payload: payload}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-recv).Sub(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// reportLatency reports the median and 99th percentile of lat.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
