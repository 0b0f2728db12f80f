package daemon

import (
	"log/slog"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/transport/mqtt"
)

// mqttConfig is the MQTT client configuration of c: brokers, client id,
// keep-alive, session, reconnect backoff, maximum packet size, credentials
// and TLS.
func mqttConfig(c agent.MQTTConfig, log *slog.Logger) (mqtt.Config, error) {
	mc := mqtt.Config{
		Brokers:       c.Brokers,
		ClientID:      c.ClientID,
		KeepAlive:     c.KeepAlive,
		SessionExpiry: c.SessionExpiry,
		MaxBackoff:    c.ReconnectBackoffMax,
		MaxPacketSize: c.MaxPacketSize,
		Logger:        log,
	}
	if err := mqttCredentials(c, &mc); err != nil {
		return mqtt.Config{}, err
	}
	return mc, nil
}

// mqttCredentials sets the MQTT user, password and TLS files of c in mc.
func mqttCredentials(c agent.MQTTConfig, mc *mqtt.Config) error {
	tc, err := c.TLS.Load("mqtt.tls")
	if err != nil {
		return err
	}
	mc.TLSConfig = tc // nil: the system roots, for mqtts:// brokers
	mc.Username = c.Username
	if p := c.Password.Value(); p != "" {
		mc.Password = []byte(p)
	}
	return nil
}

// subscribeStateReports routes the devices' state reports
// (<prefix>/dev/+/state) to ag, which updates their reported twin state
// while it holds them (twins on), and hands their "fw" field to the
// firmware job runner (jobs on), which plans the steps of a held device's
// job from it. It subscribes
// on the running client, once ag exists: see the package doc.
func subscribeStateReports(c *mqtt.Client, topics mqtt.Topics, ag *agent.Agent) {
	c.Subscribe(topics.State("+"), func(m mqtt.Message) {
		dev, leaf, ok := topics.Parse(m.Topic)
		if !ok || leaf != mqtt.LeafState {
			return
		}
		ag.DeviceStateReport(dev, m.Payload) // counts and logs (rate-limited) the malformed
	})
}
