package mqtt

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Defaults applied by Dial to zero Config fields.
const (
	DefaultKeepAlive      = 30 * time.Second
	DefaultSessionExpiry  = 5 * time.Minute
	DefaultConnectTimeout = 5 * time.Second
	DefaultMinBackoff     = 250 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
)

// Config configures a Client. The zero value of every field except Brokers
// and ClientID means its default.
type Config struct {
	// Brokers are tried in order on every connection attempt. Schemes:
	// mqtt:// or tcp:// (plain TCP, default port 1883) and mqtts://, ssl://,
	// tls:// or tcps:// (TLS, default port 8883). At least one is required.
	Brokers []string

	// ClientID identifies the MQTT session; it must be unique per
	// connection to the broker (a second client with the same ID takes the
	// session over and disconnects the first).
	ClientID string

	// KeepAlive is the MQTT keep-alive, whole seconds, at most 65535s.
	// Default 30s.
	KeepAlive time.Duration

	// SessionExpiry is the MQTT v5 session expiry interval: how long the
	// broker keeps the session (subscriptions and queued QoS 1 messages)
	// after the connection drops. Default 5m. A negative value means 0: the
	// session ends with the connection.
	SessionExpiry time.Duration

	// CleanStart discards any broker session on the first connection of this
	// Client (CleanStartOnInitialConnection). Reconnections never set Clean
	// Start, so they resume the session. Default false.
	CleanStart bool

	// ConnectTimeout bounds one connection attempt (TCP dial and
	// CONNECT/CONNACK). Default 5s.
	ConnectTimeout time.Duration

	// MinBackoff and MaxBackoff bound the delay between connection attempts
	// (exponential with jitter, see Dial). Defaults 250ms and 10s.
	MinBackoff, MaxBackoff time.Duration

	// Subscriptions are registered before the first connection, exactly as
	// if Subscribe were called for each right after Dial, but without the
	// race: when the broker resumes a session it may deliver queued QoS 1
	// messages the moment the connection is up, and a message that matches
	// no registered filter is acknowledged and dropped. Use this for the
	// filters whose queued messages must not be lost.
	Subscriptions []Subscription

	// Username and Password go in every CONNECT when set (the broker's
	// authentication); a broker that refuses them answers CONNACK "bad user
	// name or password" or "not authorized", and the client keeps retrying
	// with backoff, logging each refusal at Warn.
	Username string
	Password []byte

	// MaxPacketSize bounds, in bytes, the MQTT packets the client accepts:
	// the MQTT v5 Maximum Packet Size, sent in CONNECT, so that a
	// conforming broker drops a bigger message for this client instead of
	// sending it (§3.1.2.11.4). The client holds it too, against a broker
	// that ignores it: a bigger PUBLISH is read off the wire and dropped
	// without being buffered, acknowledged (reason 0x97, so that it is not
	// sent again), counted (Stats.PacketsOversize) and logged at Warn
	// (rate-limited); any other packet that big ends the connection
	// (DISCONNECT 0x95, then reconnect). Default DefaultMaxPacketSize
	// (128 KiB, which fits LargestPacket); at least MinMaxPacketSize; at
	// most MaxMaxPacketSize, MQTT's largest packet, which means no bound.
	MaxPacketSize int

	// TLSConfig is used for TLS broker URLs; nil means the system roots and
	// the URL's host name.
	TLSConfig *tls.Config

	// Logger receives connection events; nil discards them. Connection up
	// is logged at Info, connection loss and failed attempts at Warn,
	// handler panics at Error, and paho's internals at Debug.
	Logger *slog.Logger
}

// Subscription pairs a topic filter with its handler (see Client.Subscribe).
type Subscription struct {
	Filter  string
	Handler Handler
}

// broker is a parsed broker URL.
type broker struct {
	addr   string // host:port
	tls    bool
	server string // host name, for TLS
	url    *url.URL
}

// withDefaults validates cfg and returns a copy with defaults applied, plus
// the parsed broker URLs.
func (cfg Config) withDefaults() (Config, []broker, error) {
	invalid := func(format string, args ...any) (Config, []broker, error) {
		return Config{}, nil, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if len(cfg.Brokers) == 0 {
		return invalid("no Brokers")
	}
	brokers := make([]broker, 0, len(cfg.Brokers))
	for _, s := range cfg.Brokers {
		b, err := parseBroker(s)
		if err != nil {
			return invalid("broker %q: %v", s, err)
		}
		brokers = append(brokers, b)
	}
	if cfg.ClientID == "" {
		return invalid("empty ClientID")
	}
	if len(cfg.ClientID) > maxStringLen || !utf8.ValidString(cfg.ClientID) || strings.ContainsRune(cfg.ClientID, 0) {
		return invalid("ClientID is not a valid MQTT string")
	}
	for name, d := range map[string]time.Duration{
		"KeepAlive": cfg.KeepAlive, "ConnectTimeout": cfg.ConnectTimeout,
		"MinBackoff": cfg.MinBackoff, "MaxBackoff": cfg.MaxBackoff,
	} {
		if d < 0 {
			return invalid("negative %s %v", name, d)
		}
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.KeepAlive > math.MaxUint16*time.Second {
		return invalid("KeepAlive %v above 65535s", cfg.KeepAlive)
	}
	switch {
	case cfg.SessionExpiry == 0:
		cfg.SessionExpiry = DefaultSessionExpiry
	case cfg.SessionExpiry < 0:
		cfg.SessionExpiry = 0
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		return invalid("MaxBackoff %v below MinBackoff %v", cfg.MaxBackoff, cfg.MinBackoff)
	}
	switch mps := cfg.MaxPacketSize; {
	case mps == 0:
		cfg.MaxPacketSize = DefaultMaxPacketSize
	case mps < MinMaxPacketSize || mps > MaxMaxPacketSize:
		return invalid("MaxPacketSize %d outside [%d, %d]", mps, MinMaxPacketSize, MaxMaxPacketSize)
	}
	for _, s := range cfg.Subscriptions {
		if s.Handler == nil || !validFilter(s.Filter) {
			return invalid("subscription %q: invalid filter or nil handler", shorten(s.Filter))
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, brokers, nil
}

// keepAliveSeconds rounds KeepAlive up to whole seconds (at least 1).
func (cfg Config) keepAliveSeconds() uint16 {
	s := (cfg.KeepAlive + time.Second - 1) / time.Second
	return uint16(max(1, min(s, math.MaxUint16)))
}

// sessionExpirySeconds rounds SessionExpiry up to whole seconds; MQTT's
// maximum (0xFFFFFFFF) means the session never expires.
func (cfg Config) sessionExpirySeconds() uint32 {
	s := (cfg.SessionExpiry + time.Second - 1) / time.Second
	return uint32(min(s, math.MaxUint32))
}

func parseBroker(s string) (broker, error) {
	u, err := url.Parse(s)
	if err != nil {
		return broker{}, err
	}
	var b broker
	port := "1883"
	switch strings.ToLower(u.Scheme) {
	case "mqtt", "tcp":
	case "mqtts", "ssl", "tls", "tcps":
		b.tls, port = true, "8883"
	default:
		return broker{}, fmt.Errorf("unsupported scheme %q (want mqtt, tcp, mqtts, ssl, tls or tcps)", u.Scheme)
	}
	host := u.Hostname()
	if host == "" {
		return broker{}, fmt.Errorf("no host")
	}
	if p := u.Port(); p != "" {
		port = p
	}
	b.addr, b.server, b.url = net.JoinHostPort(host, port), host, u
	return b, nil
}
