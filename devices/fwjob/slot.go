package fwjob

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// DBFile is the device's bbolt file in its directory: the shim's marks,
// the job record and the boot state, one file so that one transaction
// moves them together.
const DBFile = "device.db"

// DBPath returns the database path of the device whose directory is dir.
func DBPath(dir string) string { return filepath.Join(dir, DBFile) }

// SlotPath returns the file of slot ("a" or "b") in dir.
func SlotPath(dir, slot string) string { return filepath.Join(dir, "slot-"+slot) }

// resetSlot empties slot for a new image, durably (the file and its
// directory entry fsynced).
func resetSlot(dir, slot string) error {
	f, err := os.OpenFile(SlotPath(dir, slot), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: slot %s: %w", ErrStorage, slot, err)
	}
	if err := closeSynced(f); err != nil {
		return fmt.Errorf("%w: slot %s: %w", ErrStorage, slot, err)
	}
	return syncDir(dir)
}

// writeSlot writes data at off in slot and fsyncs it.
func writeSlot(dir, slot string, off uint64, data []byte) error {
	f, err := os.OpenFile(SlotPath(dir, slot), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("%w: slot %s: %w", ErrStorage, slot, err)
	}
	if _, err := f.WriteAt(data, int64(off)); err != nil {
		f.Close()
		return fmt.Errorf("%w: slot %s at %d: %w", ErrStorage, slot, off, err)
	}
	if err := closeSynced(f); err != nil {
		return fmt.Errorf("%w: slot %s: %w", ErrStorage, slot, err)
	}
	return nil
}

func closeSynced(f *os.File) error {
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%w: sync %s: %w", ErrStorage, dir, err)
	}
	return nil
}

// hashSlot returns the SHA-256 of slot's file and its length.
func hashSlot(dir, slot string) (sum []byte, n int64, err error) {
	f, err := os.Open(SlotPath(dir, slot))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err = io.Copy(h, f)
	if err != nil {
		return nil, n, err
	}
	return h.Sum(nil), n, nil
}

// verifySlot checks that slot's SHA-256 is image; the error says what it
// holds instead.
func verifySlot(dir, slot string, image []byte) error {
	sum, n, err := hashSlot(dir, slot)
	switch {
	case err != nil:
		return fmt.Errorf("slot %s unreadable: %w", slot, err)
	case string(sum) != string(image):
		return fmt.Errorf("slot %s (%d bytes) SHA-256 %s, want %s", slot, n, short(sum), short(image))
	}
	return nil
}

// short is a hash for a reason: its first 8 bytes in hex.
func short(h []byte) string {
	if len(h) > 8 {
		h = h[:8]
	}
	return fmt.Sprintf("%x…", h)
}
