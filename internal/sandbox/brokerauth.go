package sandbox

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// BrokerAuth is what a Broker that requires credentials checks: users with
// passwords, and an ACL (Mosquitto's acl_file format, see ACL). Every
// CONNECT must carry a known user name and its password; anonymous clients
// are refused. Users and rules can be added while the broker runs (a
// Figure 1 run adds its agents' users); they apply to the next CONNECT and
// the next check. Safe for concurrent use.
type BrokerAuth struct {
	mu    sync.Mutex
	users map[string]string
	acl   *ACL

	refused, denied atomic.Uint64
}

// NewBrokerAuth returns a BrokerAuth with no users and the rules of acl.
func NewBrokerAuth(acl string) (*BrokerAuth, error) {
	a, err := ParseACL(acl)
	if err != nil {
		return nil, err
	}
	return &BrokerAuth{users: map[string]string{}, acl: a}, nil
}

// AddACL appends rules (acl_file text) to the ACL.
func (a *BrokerAuth) AddACL(text string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acl.add(text)
}

// SetPassword adds user, or changes its password.
func (a *BrokerAuth) SetPassword(user, password string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.users[user] = password
}

// User returns user's password, adding the user with a new random password
// if it has none.
func (a *BrokerAuth) User(user string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.users[user]; ok {
		return p, nil
	}
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("sandbox: broker password: %w", err)
	}
	p := hex.EncodeToString(b)
	a.users[user] = p
	return p, nil
}

// Users returns the user names, sorted.
func (a *BrokerAuth) Users() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for u := range a.users {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// Refused counts the CONNECTs refused (unknown user, wrong or no password);
// Denied the publishes, subscriptions and deliveries the ACL refused.
func (a *BrokerAuth) Refused() uint64 { return a.refused.Load() }

// Denied: see Refused.
func (a *BrokerAuth) Denied() uint64 { return a.denied.Load() }

// authenticate reports whether user and password are a known pair.
func (a *BrokerAuth) authenticate(user string, password []byte) bool {
	a.mu.Lock()
	want, ok := a.users[user]
	a.mu.Unlock()
	return ok && user != "" && subtle.ConstantTimeCompare([]byte(want), password) == 1
}

func (a *BrokerAuth) allowed(user, clientID, topic string, write bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acl.Allowed(user, clientID, topic, write)
}

// WritePasswords writes the users as "user:password" lines to path (mode
// 0600): the plain-text form that `mosquitto_passwd -U FILE` hashes in
// place, and what `edgefence-sandbox serve --mqtt-users` reads.
func (a *BrokerAuth) WritePasswords(path string) error {
	var b bytes.Buffer
	for _, u := range a.Users() {
		p, _ := a.User(u)
		fmt.Fprintf(&b, "%s:%s\n", u, p)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("sandbox: passwords: %w", err)
	}
	return nil
}

// ReadPasswords adds the users of a "user:password" file.
func (a *BrokerAuth) ReadPasswords(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("sandbox: passwords: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		u, p, ok := strings.Cut(line, ":")
		if !ok || u == "" || p == "" {
			return fmt.Errorf("%w: %s line %d: want user:password", ErrBadACL, path, n)
		}
		a.SetPassword(u, p)
	}
	return sc.Err()
}

// authHook is the mochi hook of a BrokerAuth.
type authHook struct {
	mqtt.HookBase
	a   *BrokerAuth
	log *slog.Logger
}

func (h *authHook) ID() string { return "sandbox-auth" }

func (h *authHook) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (h *authHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user := string(pk.Connect.Username)
	if h.a.authenticate(user, pk.Connect.Password) {
		return true
	}
	h.a.refused.Add(1)
	h.log.Warn("broker refused a client: unknown user or wrong password", "client", cl.ID, "user", user, "remote", cl.Net.Remote)
	return false
}

func (h *authHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	user := string(cl.Properties.Username)
	if h.a.allowed(user, cl.ID, topic, write) {
		return true
	}
	h.a.denied.Add(1)
	op := "read"
	if write {
		op = "write"
	}
	h.log.Warn("broker ACL denied", "op", op, "topic", topic, "client", cl.ID, "user", user)
	return false
}
