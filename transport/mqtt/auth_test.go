package mqtt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
)

// Username and Password reach a broker that authenticates: the right ones
// connect; a wrong password is refused, and the client keeps retrying.
func TestUsernamePassword(t *testing.T) {
	b := newBroker(t, freeAddr(t))
	b.auth = new(auth.Hook)
	b.authOpts = &auth.Options{Ledger: &auth.Ledger{Auth: auth.AuthRules{
		{Username: "gw-1", Password: "s3cret", Allow: true},
	}}}
	b.start()

	ok := dial(t, b.url(), "auth-ok", func(c *Config) { c.Username, c.Password = "gw-1", []byte("s3cret") })
	if err := ok.AwaitConnection(timeout(t, 5*time.Second)); err != nil {
		t.Fatalf("right password: %v", err)
	}
	for _, tc := range []struct {
		name       string
		user, pass string
	}{
		{"wrong password", "gw-1", "guess"},
		{"no credentials", "", ""},
		{"unknown user", "gw-2", "s3cret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, b.url(), "auth-"+tc.user+tc.pass, func(c *Config) { c.Username, c.Password = tc.user, []byte(tc.pass) })
			err := c.AwaitConnection(timeout(t, 500*time.Millisecond))
			if !errors.Is(err, context.DeadlineExceeded) || c.Connected() {
				t.Fatalf("connected with %s: %v", tc.name, err)
			}
		})
	}
}
