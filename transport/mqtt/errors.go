package mqtt

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap them; test with
// errors.Is.
var (
	// ErrClosed means the client was closed (by Close or by cancelling the
	// context given to Dial).
	ErrClosed = errors.New("mqtt: client closed")

	// ErrNotConnected means there was no broker connection when the request
	// was made: the message was not sent. Retry after AwaitConnection or
	// hand the message to a durable outbox.
	ErrNotConnected = errors.New("mqtt: not connected")

	// ErrConnectionLost means the connection dropped after a QoS 1 PUBLISH
	// was handed to the connection but before its PUBACK arrived. The outcome
	// is unknown: the broker may have the message, and paho retransmits it
	// (DUP set) if the next connection resumes the same broker session. It
	// wraps ErrNotConnected, so errors.Is(err, ErrNotConnected) holds too.
	ErrConnectionLost = fmt.Errorf("%w: connection lost before PUBACK (outcome unknown)", ErrNotConnected)

	// ErrInvalidConfig means Dial was given a Config it cannot use.
	ErrInvalidConfig = errors.New("mqtt: invalid config")

	// ErrInvalidMessage means Publish was given a message that is not a valid
	// MQTT v5 PUBLISH (empty topic, wildcards, NUL, invalid UTF-8, or a field
	// beyond its protocol size limit). Nothing was sent.
	ErrInvalidMessage = errors.New("mqtt: invalid message")

	// ErrRejected means the broker answered with a failure reason code
	// (>= 0x80), for example "not authorized".
	ErrRejected = errors.New("mqtt: rejected by broker")
)
