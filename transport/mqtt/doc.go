// Package mqtt is edgefence's MQTT v5 transport: a Client that keeps one
// connection to a broker up, publishes at QoS 1, and routes received messages
// to handlers, plus Topics, the topic layout shared by the agent and the fence
// points on devices:
//
//	<prefix>/dev/<device>/cmd    agent → device, fenced commands
//	<prefix>/dev/<device>/ack    device → agent, acknowledgements
//	<prefix>/dev/<device>/state  device → agent, reported state
//
// The Client wraps paho.golang's autopaho. Dial returns at once; the
// connection (plain TCP or TLS) comes up in the background and is
// re-established with exponential backoff and jitter whenever it drops. Its
// lifetime is the context given to Dial, or until Close. By default the
// broker keeps the session for five minutes after a connection drops, so QoS
// 1 messages queued for this client survive a short outage.
//
// # Publishing
//
// Publish sends at QoS 1 and blocks until the broker's PUBACK. It does not
// queue: while the client is disconnected it fails at once with an error
// wrapping ErrNotConnected, so the caller decides whether to wait
// (AwaitConnection), retry, or keep the message in a durable outbox. If the
// connection drops while Publish waits for the PUBACK, it returns
// ErrConnectionLost at once (which also matches ErrNotConnected); the outcome
// is then unknown and paho retransmits the message if the next connection
// resumes the same broker session. Receivers must therefore expect
// duplicates, as always with QoS 1.
//
// # Receiving: handler dispatch
//
// Handlers run inline on paho's delivery goroutine, not on goroutines of
// ours. paho reads packets on one goroutine and delivers PUBLISH packets on
// another, one at a time in arrival order, and sends the PUBACK only when the
// handlers have returned. This gives at-least-once delivery end to end: if
// the process dies or the connection drops before a handler returns, the
// broker still holds the message and delivers it again (Duplicate set) on
// the next connection of the same session. Do durable work (persisting a
// fence point's state) before returning, and keep it short: while a handler
// runs, no other message of this client is delivered.
//
// A handler may call Publish, for example to send a command's
// acknowledgement to its response topic: PUBACKs for our own publishes are
// read by paho's reader goroutine, not the delivery goroutine, so they are
// not stuck behind the handler, and if the connection drops while the
// handler waits, Publish returns ErrConnectionLost at once so that paho can
// finish shutting the connection down and reconnect. A handler must not
// call Close, which waits for running handlers to return. A panicking
// handler is logged at Error and its message is acknowledged, so that one
// poison message cannot crash the agent or be redelivered forever.
//
// We chose inline dispatch over dispatching to goroutines of our own because
// acknowledging a message only after it was handled is the guarantee the
// fence protocol needs; with our own dispatch the PUBACK would go out when
// the message was queued, and a crash would lose it.
//
// # Subscriptions
//
// Subscribe registers a filter and handler for the life of the client. One
// goroutine owned by the client subscribes every registered filter whenever
// a connection comes up (so subscriptions survive a broker that lost the
// session) and when Subscribe adds one; OnConnectionUp never blocks.
// AwaitSubscribed waits until the broker has acknowledged them all. Routing
// is done here, by matching each message's topic against the registered
// filters, so messages the broker delivers from a resumed session before
// the resubscription completes still reach their handlers, provided the
// filter was registered before the connection came up: register filters
// whose queued messages must not be lost in Config.Subscriptions, because a
// message that matches no registered filter is acknowledged and dropped.
//
// # Goroutines
//
// Besides paho's own, the client runs one goroutine. Close (or cancelling
// the Dial context) stops all of them; Done is closed when they have
// stopped.
package mqtt
