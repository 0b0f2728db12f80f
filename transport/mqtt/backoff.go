package mqtt

import "time"

// backoff is autopaho's ReconnectBackoff: the delay before connection
// attempt number attempt (0-based, counted from the moment the connection
// was lost or the client started), drawn by c.reconnect from [MinBackoff,
// min(MinBackoff·2^(attempt+1), MaxBackoff)] — full jitter above a floor, so
// a fleet of gateways does not reconnect in lockstep after a broker restart.
// The very first attempt of a client that has never connected is
// immediate; after a lost connection even the first attempt waits (the
// broker is likely restarting, and so are its other clients).
func (c *Client) backoff(attempt int) time.Duration {
	if attempt == 0 && !c.everUp.Load() {
		return 0
	}
	return c.reconnect.Delay(attempt)
}
