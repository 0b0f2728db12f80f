package agent

import "errors"

// Sentinel errors, for errors.Is.
var (
	// ErrNotHolder means the agent does not hold the device's lease now
	// (still campaigning, or the session was lost).
	ErrNotHolder = errors.New("agent: not the lease holder")
	// ErrUnknownDevice means the device is not in the agent's configuration.
	ErrUnknownDevice = errors.New("agent: unknown device")
	// ErrConfig means the configuration is invalid; the message names the field.
	ErrConfig = errors.New("agent: invalid config")
	// ErrNoAck means no acknowledgement arrived within the command timeout:
	// the command's fate at the device is unknown.
	ErrNoAck = errors.New("agent: no ack")
	// ErrQueued comes with ErrNoAck when the agent has an outbox: the
	// command is stored and will be delivered (resent until the device
	// answers, or expired if never sent within its time to live); its
	// terminal state is recorded in the outbox (`edgefence outbox show`).
	ErrQueued = errors.New("agent: command queued in the outbox")
	// ErrUnreachable means no agent answers on the API socket: the socket
	// file is missing (ENOENT), refuses connections (ECONNREFUSED: a stale
	// socket of an agent that exited), or may not be opened (EACCES). The
	// error also wraps the syscall error.
	ErrUnreachable = errors.New("agent: not reachable")
	// ErrBadBody means a command body (JSON) is refused before any command
	// is issued: not one JSON value, or a number CBOR cannot carry as
	// written. The message says where in the body.
	ErrBadBody = errors.New("agent: bad command body")
	// ErrUnsafeBuild means a test or demo switch (an Unsafe option) was
	// set in a build without -tags edgefence_unsafe.
	ErrUnsafeBuild = errors.New("agent: unsafe option needs a build with -tags edgefence_unsafe")
	// ErrNoOutbox means New was given no outbox: every command goes
	// through one (Options.Outbox).
	ErrNoOutbox = errors.New("agent: no outbox")
	// ErrNoFenceTable means the agent keeps no fence table: its gateway is
	// home of no `fence: gateway` device.
	ErrNoFenceTable = errors.New("agent: no fence table")
	// ErrConfigEdit means a config file cannot be edited in place with
	// every other byte kept (EditConfigAuth): the caller shows the edit
	// for the operator to make instead.
	ErrConfigEdit = errors.New("agent: config not edited in place")
)
