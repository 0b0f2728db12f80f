package agent

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/edgefence/edgefence/devices/shim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/fence/auth"
	"github.com/edgefence/edgefence/fence/auth/authtest"
	"github.com/edgefence/edgefence/offline"
)

// signedShim is a Sender and TrustPublisher in front of a real device shim
// provisioned with the operator's root only: commands go signed by gw,
// trust updates reach the shim unless the device is "offline" for them
// (drop: that many updates are lost before one arrives).
type signedShim struct {
	gw   *auth.Signer
	shim *shim.Shim

	mu        sync.Mutex
	drop      int // trust updates still to lose
	published int
}

type acceptAll struct{}

func (acceptAll) Check(*fence.Envelope) error { return nil }
func (acceptAll) Apply(*fence.Envelope) error { return nil }

func (s *signedShim) Send(_ context.Context, env *fence.Envelope) (*fence.Ack, error) {
	raw, err := s.gw.Sign(env)
	if err != nil {
		return nil, err
	}
	ack := s.shim.Handle(env.Device, raw, acceptAll{})
	return &ack, nil
}

func (s *signedShim) PublishTrust(_ context.Context, dev string, update []byte) error {
	s.mu.Lock()
	s.published++
	lost := s.drop > 0
	if lost {
		s.drop--
	}
	s.mu.Unlock()
	if !lost {
		if res := s.shim.Process(dev, update, acceptAll{}); res.Update == nil {
			return errors.New("not taken as a trust update")
		}
	}
	return nil
}

func (s *signedShim) publishes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.published
}

// TestTrustRetry: a device that never got the gateway's trust update (it
// was offline when the update went out) refuses the first command invalid
// for want of the gateway's certificate; the agent publishes the update
// again and resends the same envelope, which is accepted — one command, one
// verdict. A device the updates never reach refuses the command for good
// after trustRetries more updates, and that refusal is its verdict.
func TestTrustRetry(t *testing.T) {
	op := authtest.NewOperator(t)
	gw := op.Certify("gw-1", "d*")
	for _, c := range []struct {
		name    string
		drop    int
		verdict fence.Verdict
		pubs    int
	}{
		{"update lost once", 1, fence.Accepted, 2},
		{"never reaches the device", 100, fence.Invalid, 1 + trustRetries},
	} {
		t.Run(c.name, func(t *testing.T) {
			sh, err := shim.Open(filepath.Join(t.TempDir(), "dev.db"), &shim.Options{Keys: op.Trust()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sh.Close() })
			fp := &signedShim{gw: gw.Signer, shim: sh, drop: c.drop}
			cfg := &Config{Gateway: "gw-1", Etcd: EtcdConfig{Endpoints: testEtcd.Endpoints(), Prefix: "/t/" + t.Name(), LeaseTTL: 2 * time.Second},
				MQTT: MQTTConfig{Brokers: []string{"mqtt://127.0.0.1:1"}}, Command: CommandConfig{Timeout: 10 * time.Second},
				Auth: AuthConfig{KeyFile: "k", KeyID: "gw-1"}, Devices: []DeviceConfig{{ID: "d1", Auth: AuthRequired}}}
			a := runAgent(t, cfg, etcdClient(t), fp, Options{TrustUpdates: &TrustUpdates{Certificate: gw.Cert, Publisher: fp}})
			waitFor(t, "holding d1", holdingAll(a, []string{"d1"}))
			ack, _ := a.Send(t.Context(), "d1", "set", nil)
			if ack == nil || ack.Verdict != c.verdict {
				t.Fatalf("ack %+v, want %v", ack, c.verdict)
			}
			if n := fp.publishes(); n != c.pubs {
				t.Errorf("%d trust updates published, want %d", n, c.pubs)
			}
			if n := a.delivery.stats.trustRetried.Load(); n != uint64(c.pubs-1) {
				t.Errorf("trustRetried %d, want %d", n, c.pubs-1)
			}
			recs, err := a.outbox.List(offline.Filter{Device: "d1"})
			if err != nil || len(recs) != 1 || recs[0].State != c.verdict {
				t.Fatalf("outbox %+v (%v): want one entry, %v", recs, err, c.verdict)
			}
		})
	}
}
