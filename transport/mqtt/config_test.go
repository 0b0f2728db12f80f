package mqtt

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/internal/backoff"
)

func TestConfigDefaults(t *testing.T) {
	cfg, brokers, err := Config{Brokers: []string{"mqtt://h"}, ClientID: "c"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KeepAlive != DefaultKeepAlive || cfg.SessionExpiry != DefaultSessionExpiry ||
		cfg.ConnectTimeout != DefaultConnectTimeout || cfg.MinBackoff != DefaultMinBackoff ||
		cfg.MaxBackoff != DefaultMaxBackoff || cfg.Logger == nil || cfg.CleanStart || cfg.MaxPacketSize != DefaultMaxPacketSize {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if cfg.keepAliveSeconds() != 30 || cfg.sessionExpirySeconds() != 300 {
		t.Errorf("keepalive %d, session expiry %d", cfg.keepAliveSeconds(), cfg.sessionExpirySeconds())
	}
	if brokers[0].addr != "h:1883" || brokers[0].tls {
		t.Errorf("broker %+v", brokers[0])
	}

	cfg, _, err = Config{Brokers: []string{"tcp://h:1"}, ClientID: "c", SessionExpiry: -1, KeepAlive: 1500 * time.Millisecond, MinBackoff: 20 * time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.sessionExpirySeconds() != 0 || cfg.keepAliveSeconds() != 2 || cfg.MaxBackoff != 20*time.Second {
		t.Errorf("got session expiry %d, keepalive %d, max backoff %v", cfg.sessionExpirySeconds(), cfg.keepAliveSeconds(), cfg.MaxBackoff)
	}
	for in, want := range map[string]string{
		"mqtts://h": "h:8883", "TLS://h:1": "h:1", "ssl://[::1]": "[::1]:8883", "tcp://h:2": "h:2",
	} {
		b, err := parseBroker(in)
		if err != nil || b.addr != want {
			t.Errorf("parseBroker(%q) = %+v, %v; want addr %s", in, b, err, want)
		}
	}
}

func TestConfigInvalid(t *testing.T) {
	ok := Config{Brokers: []string{"mqtt://127.0.0.1:1883"}, ClientID: "c"}
	for name, mod := range map[string]func(*Config){
		"no brokers":       func(c *Config) { c.Brokers = nil },
		"bad scheme":       func(c *Config) { c.Brokers = []string{"http://h"} },
		"websocket":        func(c *Config) { c.Brokers = []string{"ws://h"} },
		"no host":          func(c *Config) { c.Brokers = []string{"mqtt://"} },
		"no scheme":        func(c *Config) { c.Brokers = []string{"127.0.0.1:1883"} },
		"bad url":          func(c *Config) { c.Brokers = []string{"mqtt://h:port\x7f"} },
		"no client id":     func(c *Config) { c.ClientID = "" },
		"bad client id":    func(c *Config) { c.ClientID = "a\x00" },
		"long client id":   func(c *Config) { c.ClientID = strings.Repeat("a", 65536) },
		"negative ka":      func(c *Config) { c.KeepAlive = -time.Second },
		"huge ka":          func(c *Config) { c.KeepAlive = 70000 * time.Second },
		"negative timeout": func(c *Config) { c.ConnectTimeout = -1 },
		"backoff inverted": func(c *Config) { c.MinBackoff, c.MaxBackoff = time.Second, time.Millisecond },
		"negative backoff": func(c *Config) { c.MinBackoff = -1 },
		"bad subscription": func(c *Config) { c.Subscriptions = []Subscription{{Filter: "a/#/b", Handler: func(Message) {}}} },
		"nil sub handler":  func(c *Config) { c.Subscriptions = []Subscription{{Filter: "a"}} },
		"empty sub filter": func(c *Config) { c.Subscriptions = []Subscription{{Handler: func(Message) {}}} },
		"negative mps":     func(c *Config) { c.MaxPacketSize = -1 },
		"tiny mps":         func(c *Config) { c.MaxPacketSize = MinMaxPacketSize - 1 },
		"mps beyond mqtt":  func(c *Config) { c.MaxPacketSize = MaxMaxPacketSize + 1 },
	} {
		cfg := ok
		mod(&cfg)
		c, err := Dial(context.Background(), cfg)
		if !errors.Is(err, ErrInvalidConfig) || c != nil {
			t.Errorf("%s: Dial = %v, %v; want ErrInvalidConfig", name, c, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, ok); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with cancelled ctx: %v", err)
	}
}

// TestReconnectBackoff: the client's first attempt is immediate, later ones
// (and every one after a lost connection) wait within [MinBackoff,
// min(MinBackoff·2^(attempt+1), MaxBackoff)] of its Config.
func TestReconnectBackoff(t *testing.T) {
	lo, hi := 300*time.Millisecond, 3*time.Second
	c, err := Dial(context.Background(), Config{Brokers: []string{"mqtt://127.0.0.1:1"}, ClientID: "c", MinBackoff: lo, MaxBackoff: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if d := c.backoff(0); d != 0 {
		t.Errorf("first attempt ever: waits %v", d)
	}
	c.everUp.Store(true)
	for attempt := range 8 {
		ceiling := min(lo<<(attempt+1), hi)
		for range 100 {
			if d := c.backoff(attempt); d < lo || d > ceiling {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, lo, ceiling)
			}
		}
	}
}

// TestBackoffAfterOutage measures what the ceiling (agent config key
// mqtt.reconnect_backoff_max) means for a broker outage of 30s: how long
// after the broker is back the client's next attempt comes, and how many
// attempts the outage cost (README, "MQTT broker outages"). Attempts
// against a down broker are taken as instant (connection refused).
//
//	go test ./transport/mqtt -run TestBackoffAfterOutage -v
func TestBackoffAfterOutage(t *testing.T) {
	const outage, runs = 30 * time.Second, 20000
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, hi := range []time.Duration{2 * time.Second, 5 * time.Second, 10 * time.Second} {
		gaps := make([]time.Duration, 0, runs)
		attempts := 0
		b := backoff.Backoff{Min: DefaultMinBackoff, Max: hi, Rand: rnd.Int64N}
		for range runs {
			var at time.Duration
			for a := 0; ; a++ {
				at += b.Delay(a)
				if at >= outage {
					gaps = append(gaps, at-outage)
					break
				}
				attempts++
			}
		}
		slices.Sort(gaps)
		var sum time.Duration
		for _, g := range gaps {
			sum += g
		}
		if gaps[len(gaps)-1] > hi {
			t.Errorf("ceiling %v: a gap of %v", hi, gaps[len(gaps)-1])
		}
		t.Logf("ceiling %v: back %v after the broker on average (p99 %v, max %v); %.1f attempts during the outage",
			hi, (sum / runs).Round(time.Millisecond), gaps[runs*99/100].Round(time.Millisecond), gaps[runs-1].Round(time.Millisecond),
			float64(attempts)/runs)
	}
}
