package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/edgefence/edgefence/devices/sim"
	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// The Figure 1 run's trust (Figure1Config.Trust) and its forgery scene
// (Figure1Config.Forgery): a broker client that may publish on the
// devices' command topics, but holds no gateway's signing key, sends the
// envelope that bricked a device before invariant I7: token 2^63.

// ForgerUser is the broker user of the forgery scene: it has a gateway's
// rights (GatewayACL), as a leaked gateway password would give, and no
// signing key.
const ForgerUser = "mallory"

// ForgedToken is the forged envelope's token: 2^63, above any etcd
// revision, so a fence point that took it would refuse every real command
// after it as stale.
const ForgedToken fence.Token = 1 << 63

// ForgeryResult is what became of the forged envelope.
type ForgeryResult struct {
	Device      string
	Verdict     fence.Verdict // the device's verdict on the forgery (its verdict log)
	Reason      string
	Before      fence.Mark // the device's mark before the forgery
	After       fence.Mark // its mark after deciding it
	Next        SendResult // B's next command to the device
	NextVerdict fence.Verdict
}

// Check says what a forgery that changed nothing looks like: refused
// invalid, the mark unchanged, the holder's next command accepted.
func (r *ForgeryResult) Check() error {
	var errs []error
	if r.Verdict != fence.Invalid {
		errs = append(errs, fmt.Errorf("%s: the forgery with token 2^63 was %s, want invalid", r.Device, r.Verdict))
	}
	if r.After != r.Before {
		errs = append(errs, fmt.Errorf("%s: mark %v after the forgery, was %v", r.Device, r.After, r.Before))
	}
	if r.Next.Verdict != fence.Accepted.String() {
		errs = append(errs, fmt.Errorf("%s: B's command after the forgery: %q %s", r.Device, r.Next.Verdict, r.Next.Error))
	}
	return errors.Join(errs...)
}

// provisionTrust makes gw-a's and gw-b's signing keys and certificates
// for the run's devices, the MQTT devices' own keys (their certificates
// published in the run's etcd, where the agents look for them), and the
// forger's broker user.
func (f *figure1) provisionTrust(ctx context.Context) error {
	c := f.cfg
	if c.Trust == nil {
		if c.Forgery {
			return errors.New("sandbox: figure 1: the forgery scene needs Trust")
		}
		return nil
	}
	if c.Forgery && c.Serial {
		return errors.New("sandbox: figure 1: the forgery scene is for MQTT devices")
	}
	f.keys = map[string]*GatewayKey{}
	for _, gw := range []string{"gw-a", "gw-b"} {
		k, err := c.Trust.Gateway(gw, c.Devices...)
		if err != nil {
			return err
		}
		f.keys[gw] = k
	}
	if !c.atGateway() { // a serial or Modbus device's acks are its home gateway's table's
		dir, certs, err := c.Trust.DeviceKeys(c.Devices...)
		if err != nil {
			return err
		}
		if err := PublishDevices(ctx, []string{c.Etcd}, c.EtcdPrefix, certs); err != nil {
			return err
		}
		f.devKeys = dir
	}
	if c.Forgery && c.Auth != nil {
		return c.Auth.AddACL(GatewayACL(c.MQTTPrefix, ForgerUser))
	}
	return nil
}

// authYAML is an agent config's auth section for k ("" without a key).
func authYAML(k *GatewayKey) string {
	if k == nil {
		return ""
	}
	return fmt.Sprintf("auth:\n  key_file: %s\n  key_id: %s\n  certificate: %s\n  trust_root: %s\n  trust_root_kid: %s\n",
		yamlQuote(k.KeyFile), yamlQuote(k.KeyID), yamlQuote(k.Certificate), yamlQuote(k.TrustRoot), yamlQuote(k.TrustRootKID))
}

// forge runs the forgery scene while B holds the devices: the forger
// publishes a plain envelope with token 2^63 to the first device, the run
// waits for the device's verdict on it, and B commands the device again.
func (f *figure1) forge(ctx context.Context, p *figure1Procs, res *Figure1Result) error {
	c := f.cfg
	dev := c.Devices[0]
	body, err := sim.SetBody{Setpoint: new(SetpointLate)}.Encode()
	if err != nil {
		return err
	}
	const id = "forged-2-pow-63"
	raw, err := fence.MarshalEnvelope(&fence.Envelope{V: fence.Version, Device: dev, Token: ForgedToken, Seq: 1, ID: id,
		Kind: sim.KindSet, Body: body, Holder: ForgerUser})
	if err != nil {
		return err
	}
	mc := mqtt.Config{Brokers: []string{c.MQTT}, ClientID: ForgerUser + "-" + f.cfg.MQTTPrefix, CleanStart: true}
	who := "an anonymous broker client"
	if c.Auth != nil {
		pass, err := c.Auth.User(ForgerUser)
		if err != nil {
			return err
		}
		mc.Username, mc.Password = ForgerUser, []byte(pass)
		who = fmt.Sprintf("a broker client logged in as %q, with a gateway's publish rights (a leaked gateway password) but no signing key,", ForgerUser)
	}
	cl, err := mqtt.Dial(ctx, mc)
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	if err := cl.AwaitConnection(ctx); err != nil {
		return fmt.Errorf("forger: %w", err)
	}
	topic := mqtt.Topics{Prefix: c.MQTTPrefix}.Cmd(dev)
	if err := cl.Publish(ctx, mqtt.Message{Topic: topic, Payload: raw}); err != nil {
		return fmt.Errorf("forger: %w", err)
	}
	f.say("%s publishes an UNSIGNED envelope with token 2^63 (setpoint=%g) to %s — the %d bytes `mosquitto_pub -t %s -f FILE` would send",
		who, SetpointLate, topic, len(raw), topic)
	r := &ForgeryResult{Device: dev}
	if err := f.awaitVerdict(ctx, dev, id, r); err != nil {
		return err
	}
	f.say("%s: %s (%s); its mark stays token %d seq %d", dev, r.Verdict, shortReason(r.Reason), r.After.Token, r.After.Seq)
	if r.Next, err = f.send(ctx, p.sockB, dev, SetpointB); err != nil {
		return err
	}
	f.say("B's next command to %s (token %d): %s", dev, res.TokenB[dev], r.Next.Verdict)
	res.Forgery = r
	return nil
}

// awaitVerdict polls the devices' verdict log for the record of command
// id, and fills in r's verdict and the device's marks before and after it.
func (f *figure1) awaitVerdict(ctx context.Context, dev, id string, r *ForgeryResult) error {
	for {
		lf, err := os.Open(f.path("verdicts.jsonl"))
		if err != nil {
			return err
		}
		recs, err := sim.ReadVerdictLog(lf)
		lf.Close()
		if err != nil {
			return err
		}
		for i, rec := range recs {
			if rec.ID != id || rec.Device != dev {
				continue
			}
			for j := i - 1; j >= 0; j-- {
				if recs[j].Device == dev {
					r.Before = recs[j].Mark()
					break
				}
			}
			r.Verdict, r.Reason, r.After = rec.Verdict, rec.Reason, rec.Mark()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no verdict on the forgery from %s: %w", dev, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// shortReason is a refusal's reason without the "invalid envelope" the
// verdict already says.
func shortReason(s string) string {
	return strings.TrimPrefix(s, fence.ErrInvalid.Error()+": ")
}
