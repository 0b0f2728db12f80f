package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefence/edgefence/transport/mqtt"
)

// The password file round-trips; a bad line is an error naming it.
func TestBrokerAuthPasswords(t *testing.T) {
	a, err := NewBrokerAuth(DeviceACL("p"))
	if err != nil {
		t.Fatal(err)
	}
	p1, err := a.User("dev-1")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := a.User("dev-1"); again != p1 || len(p1) != 24 {
		t.Fatalf("User twice: %q then %q", p1, again)
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := a.WritePasswords(path); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("password file: %v %v", st, err)
	}
	b, _ := NewBrokerAuth("")
	if err := b.ReadPasswords(path); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.User("dev-1"); p != p1 {
		t.Fatalf("read back %q, want %q", p, p1)
	}
	if err := os.WriteFile(path, []byte("# users\nok:pw\nnocolon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadPasswords(path); !errors.Is(err, ErrBadACL) || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("bad line: %v", err)
	}
	if err := b.AddACL("topic bogus a/#/b\n"); !errors.Is(err, ErrBadACL) {
		t.Fatalf("AddACL: %v", err)
	}
}

// A broker with Auth refuses anonymous clients and wrong passwords and
// counts them; a denied publish gets "not authorized" and is counted.
func TestBrokerAuthRefuses(t *testing.T) {
	a, err := NewBrokerAuth(DeviceACL("p"))
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := a.User("dev-1")
	b := startBroker(t, BrokerConfig{Auth: a})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dial := func(id, user, password string) *mqtt.Client {
		c, err := mqtt.Dial(ctx, mqtt.Config{Brokers: []string{b.URL()}, ClientID: id, CleanStart: true, Username: user, Password: []byte(password)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	for _, c := range []*mqtt.Client{dial("anon", "", ""), dial("wrong", "dev-1", "x")} {
		actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
		if err := c.AwaitConnection(actx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("connected: %v", err)
		}
		acancel()
	}
	if a.Refused() < 2 {
		t.Errorf("Refused = %d", a.Refused())
	}
	ok := dial("dev", "dev-1", pass)
	if err := ok.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ok.Publish(ctx, mqtt.Message{Topic: "p/dev/dev-1/ack", Payload: []byte("x")}); err != nil {
		t.Errorf("own ack: %v", err)
	}
	if err := ok.Publish(ctx, mqtt.Message{Topic: "p/dev/dev-2/ack", Payload: []byte("x")}); !errors.Is(err, mqtt.ErrRejected) {
		t.Errorf("another device's ack: %v, want ErrRejected", err)
	}
	if a.Denied() != 1 {
		t.Errorf("Denied = %d, want 1", a.Denied())
	}
}
