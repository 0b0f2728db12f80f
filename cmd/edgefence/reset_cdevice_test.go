package main

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefence/edgefence/fence"
	"github.com/edgefence/edgefence/internal/sandbox"
)

// TestFenceResetBrickedDevice's scenario on the C device (efsdev, the
// devices/firmware library, --reset-root): bricked by an unsigned 2^63
// forgery, brought back by `edgefence fence reset`, killed with SIGKILL
// right after the reset's ack with the mark and the reset counter on its
// flash file (read here from the bytes: the newest slot, format 3); after
// the restart the replayed reset, another device's and a gateway key's are
// refused, the mark unchanged.
func TestFenceResetCDevice(t *testing.T) {
	resetBricked(t, cResetDevice(sandbox.CDeviceForTest(t), "--devices", "dev-1,dev-2"))
}

// TestFenceResetCFirmwareDevice is the same scenario on the C device's
// firmware mode (efsdev --firmware: efs_fw_handle, the thermostat beside
// the firmware job, one device per process): before, efs_fw_process refused
// the reset as a command and the device stayed bricked. The job record's
// tag and the reset counter it carries are proven by the firmware vectors
// and power cuts (devices/firmware: TestFirmwareJobHost).
func TestFenceResetCFirmwareDevice(t *testing.T) {
	resetBricked(t, cResetDevice(sandbox.CDeviceForTest(t), "--firmware", "--devices", "dev-1"))
}

// cResetDevice is efsdev (bin, with flags) given the operator's root for
// resets, its mark read from its flash file's bytes, its logs checked for
// sanitizer reports.
func cResetDevice(bin string, flags ...string) resetDevice {
	return resetDevice{
		args: func(url, dir, pub string) []string {
			return append(append([]string{bin}, flags...), "--mqtt", url, "--dir", dir, "--client-id", "efsdev",
				"--reset-root", pub, "--trust-root-kid", "operator")
		},
		onDisk: func(t *testing.T, dir, dev string) (fence.Mark, uint64) {
			b, err := os.ReadFile(filepath.Join(dir, dev+".flash"))
			if err != nil {
				t.Fatal(err)
			}
			m, counter, ok := newestFlashSlot(b)
			if !ok {
				t.Fatalf("%s.flash: no valid slot", dev)
			}
			return m, counter
		},
		logCheck: func(t *testing.T, log string) {
			b, _ := os.ReadFile(log)
			if strings.Contains(string(b), "AddressSanitizer") || strings.Contains(string(b), "runtime error:") {
				t.Errorf("%s: sanitizer report:\n%s", filepath.Base(log), b)
			}
		},
	}
}

// newestFlashSlot reads the library's two flash slots (src/efs_mark.c:
// format 1, 2 with the reset counter, or 3 with its epoch too) and returns
// the newest valid one's mark and counter.
func newestFlashSlot(b []byte) (fence.Mark, uint64, bool) {
	const sector = 4096
	var best fence.Mark
	var bestGen uint32
	var bestCounter uint64
	for s := 0; s+sector <= len(b) && s < 2*sector; s += sector {
		p := b[s : s+sector]
		if p[0] == 0xff {
			continue
		}
		at, extra := 6, 0
		switch p[5] {
		case 0:
			at, extra = 7, 8
		case 1:
			at, extra = 7, 16
		}
		l := int(p[at-1])
		end := at + l + extra
		if l < 31 || end+4 > sector ||
			crc32.Checksum(p[1:end], crc32.MakeTable(crc32.Castagnoli)) != binary.BigEndian.Uint32(p[end:]) {
			continue
		}
		var rec fence.MarkRecord
		if rec.UnmarshalBinary(p[at:at+l]) != nil {
			continue
		}
		if gen := binary.BigEndian.Uint32(p[1:]); gen > bestGen {
			best, bestGen = rec.Mark, gen
			bestCounter = 0
			if extra > 0 {
				bestCounter = binary.BigEndian.Uint64(p[at+l:])
			}
		}
	}
	return best, bestCounter, bestGen > 0
}
