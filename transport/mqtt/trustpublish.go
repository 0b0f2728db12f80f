package mqtt

import (
	"context"
	"errors"
	"fmt"
)

// PublishTrust publishes a trust update (fence/auth's MarshalUpdate) on
// device's command topic at QoS 1, retained, and returns once the broker
// has it (PUBACK): a command published afterwards on the same topic
// reaches the device after it, and a device that subscribes later (one
// that was offline, or has no session at the broker) gets the newest
// update when it subscribes. While the broker is unreachable it waits for the
// connection and publishes again (a repeated update changes nothing at a
// fence point). The fence point sends no ack for it.
func (m *Commander) PublishTrust(ctx context.Context, device string, update []byte) error {
	msg := Message{Topic: m.topics.Cmd(device), Payload: update, Retain: true}
	for {
		err := m.c.Publish(ctx, msg)
		if err == nil || !errors.Is(err, ErrNotConnected) {
			return err
		}
		if werr := m.c.AwaitConnection(ctx); werr != nil {
			return fmt.Errorf("%w (%w)", werr, err)
		}
	}
}
