package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/edgefence/edgefence/fence"
)

// Role says what a certified key may sign (certificate key 7). Gateway
// keys sign commands; device keys sign a device's acks and state reports.
// Neither is ever accepted for the other: Trust.Key (who may command)
// refuses a device key, so a stolen device cannot raise any mark, and
// Trust.DeviceKey (who speaks for a device) refuses a gateway key.
type Role uint8

const (
	// RoleGateway is a gateway's key: it signs commands for the devices
	// its certificate names. Absent from the certificate (0), so the
	// certificates issued before roles existed keep their meaning.
	RoleGateway Role = 0
	// RoleDevice is a device's key: it signs that one device's acks and
	// state reports, and nothing else.
	RoleDevice Role = 1
)

// ErrWrongRole means a key was presented for what its role does not allow:
// a device key signing a command, a gateway key speaking for a device.
var ErrWrongRole = errors.New("auth: key of the wrong role")

func (r Role) String() string {
	switch r {
	case RoleGateway:
		return "gateway"
	case RoleDevice:
		return "device"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

func (r Role) verb() string {
	if r == RoleDevice {
		return "speak for"
	}
	return "command"
}

// check refuses a certificate whose devices its role does not allow: a
// device certificate covers exactly one device, named (no wildcard).
func (r Role) check(devices []string) error {
	switch r {
	case RoleGateway:
		return nil
	case RoleDevice:
		if len(devices) != 1 || strings.HasSuffix(devices[0], "*") {
			return fmt.Errorf("a device certificate names exactly one device, got %q", devices)
		}
		return fence.ValidateDeviceID(devices[0])
	}
	return fmt.Errorf("unknown role %d", r)
}

// CertifyDevice returns a certificate for a device's key (RoleDevice): it
// may sign that device's acks and state reports, and never a command.
func (r *Root) CertifyDevice(kid []byte, pub *ecdsa.PublicKey, device string, notBefore, notAfter time.Time, serial uint64) ([]byte, error) {
	if err := RoleDevice.check([]string{device}); err != nil {
		return nil, fmt.Errorf("auth: certify device: %w", err)
	}
	if len(kid) == 0 || len(kid) > MaxKeyID || pub == nil || pub.Curve != elliptic.P256() || !notAfter.After(notBefore) {
		return nil, errors.New("auth: certify device: want a kid, a P-256 key and a validity window")
	}
	key, err := newCoseKey(pub)
	if err != nil {
		return nil, err
	}
	return r.sign(ContentCertificate, Certificate{KeyID: kid, Key: key, Devices: []string{device},
		NotBefore: notBefore.Unix(), NotAfter: notAfter.Unix(), Serial: serial, Role: RoleDevice})
}

// DeviceKeys answers, for a verifier of acks and state reports, which
// public key a key id names and whether it may speak for the device. It
// returns an error wrapping ErrUnknownKey, ErrWrongRole, ErrRevoked,
// ErrExpired or ErrNotAuthorised when it may not.
type DeviceKeys interface {
	DeviceKey(kid []byte, device string) (*ecdsa.PublicKey, error)
}

// DeviceKey implements DeviceKeys: the certified device key kid (RoleDevice)
// if it is not revoked, valid now, and its certificate names device.
func (t *Trust) DeviceKey(kid []byte, device string) (*ecdsa.PublicKey, error) {
	return t.lookup(kid, device, RoleDevice)
}

// GatewayAcks is the DeviceKeys of devices whose fence point is their home
// gateway's table (`fence: gateway`): their acks are the table's, signed by
// the home gateway's key, so a gateway key certified for the device speaks
// for it (Trust.Key), and a device key does not.
type GatewayAcks struct{ Keys }

// DeviceKey implements DeviceKeys with the gateway keys of g.Keys.
func (g GatewayAcks) DeviceKey(kid []byte, device string) (*ecdsa.PublicKey, error) {
	return g.Key(kid, device)
}

var _ DeviceKeys = (*Trust)(nil)

// PublicKey returns the certified key (of a certificate ParseCertificate
// read: its signature unchecked).
func (c *Certificate) PublicKey() (*ecdsa.PublicKey, error) {
	pub, err := c.Key.public()
	if err != nil {
		return nil, refuse(ErrMalformed, "certificate key: %v", err)
	}
	return pub, nil
}
