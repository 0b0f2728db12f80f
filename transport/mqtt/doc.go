// Package mqtt is edgefence's MQTT v5 transport: a Client that keeps one
// connection to a broker up, publishes at QoS 1 and routes received messages
// to handlers, and Topics, the layout shared by the agent and fence points:
//
//	<prefix>/dev/<device>/cmd    agent → device, fenced commands
//	<prefix>/dev/<device>/ack    device → agent, acknowledgements
//	<prefix>/dev/<device>/state  device → agent, reported state
//
// Dial (over paho.golang's autopaho) returns at once; the connection (TCP or
// TLS) comes up in the background and is re-established with backoff and
// jitter. The broker keeps the session five minutes by default.
//
// Publish blocks until the PUBACK and never queues: while disconnected it
// fails with ErrNotConnected; if the connection drops while it waits it
// returns ErrConnectionLost (outcome unknown, also ErrNotConnected).
// Receivers must expect duplicates, as always with QoS 1.
//
// Handlers run inline on paho's delivery goroutine, one at a time in arrival
// order, and the PUBACK goes out only when they return: do durable work
// before returning and keep it short. A handler may Publish but must not
// Close; a panicking handler is logged and its message acknowledged.
// Subscribe registers a filter for the client's life, resubscribed on every
// connection (AwaitSubscribed waits for the SUBACKs). Register filters in
// Config.Subscriptions when messages queued in a resumed session must not be
// lost: a message matching no registered filter is acknowledged and dropped.
//
// Every CONNECT carries the MQTT v5 Maximum Packet Size (Config.MaxPacketSize,
// 128 KiB by default); a packet over it that a broker sends anyway never
// reaches paho's buffers: a PUBLISH is read off the wire, dropped,
// acknowledged and counted (Stats.PacketsOversize), anything else ends the
// connection. It also carries a Receive Maximum of 8,192: the QoS 1 and 2
// messages the broker may have sent unacknowledged at once (paho sizes a
// channel of that many slots per connection; the spec's default, 65,535,
// is 512 KiB of heap).
//
// Goroutines: besides paho's, the client runs one (resubscription). Close or
// cancelling the Dial context stops them all; Done is closed when they have.
// Why inline dispatch and more: docs/ARCHITECTURE.md, "Transport decisions".
package mqtt
