package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgefence/edgefence/fence/auth"
)

// deviceSigners reads each device's key and certificate from dir, the
// provisioning bundle `edgefence keys enrol` writes (<id>.key, <id>.cert):
// the device signs its acks and state reports with the key, under the key
// id its certificate names. Every device must have both.
func deviceSigners(dir string, ids []string) (map[string]*auth.Signer, error) {
	if dir == "" {
		return nil, nil
	}
	out := make(map[string]*auth.Signer, len(ids))
	for _, id := range ids {
		key, err := auth.ReadKey(filepath.Join(dir, id+".key"))
		if err != nil {
			return nil, fmt.Errorf("--device-keys: device %s: %w", id, err)
		}
		certPath := filepath.Join(dir, id+".cert")
		raw, err := os.ReadFile(certPath)
		if err != nil {
			return nil, fmt.Errorf("--device-keys: device %s: %w", id, err)
		}
		cert, err := auth.ParseCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("--device-keys: %s: %w", certPath, err)
		}
		pub, err := cert.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("--device-keys: %s: %w", certPath, err)
		}
		if cert.Role != auth.RoleDevice || len(cert.Devices) != 1 || cert.Devices[0] != id || !pub.Equal(&key.PublicKey) {
			return nil, fmt.Errorf("--device-keys: %s is not the device certificate of %s.key for %s", certPath, id, id)
		}
		if out[id], err = auth.NewSigner(cert.KeyID, key); err != nil {
			return nil, fmt.Errorf("--device-keys: device %s: %w", id, err)
		}
	}
	return out, nil
}
