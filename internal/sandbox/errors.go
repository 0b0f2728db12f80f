package sandbox

import "errors"

var (
	// ErrNoMosquitto is returned by StartMosquitto when the mosquitto binary
	// is not installed (apt-get install mosquitto).
	ErrNoMosquitto = errors.New("sandbox: mosquitto not installed")

	// ErrNoEtcd is returned by StartEtcdProc and FindEtcdctl when the etcd
	// binaries are not installed (apt-get install etcd-server etcd-client).
	ErrNoEtcd = errors.New("sandbox: etcd binary not installed")

	// ErrBadACL means an ACL or a password file could not be parsed.
	ErrBadACL = errors.New("sandbox: bad broker ACL")

	// ErrLineConfig means an RS485 line was given a bad config or fault.
	ErrLineConfig = errors.New("sandbox: bad RS-485 line config")

	// ErrClosed is returned by Start and Restart after Close.
	ErrClosed = errors.New("sandbox: closed")
)
