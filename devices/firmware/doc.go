// Package firmware holds the C fence point for microcontroller firmware
// (include/efshim.h, src/*.c; see README.md) and the Go tests that pin it
// to the Go fence point: the conformance vectors in testdata/vectors.h are
// generated from package fence and devices/shim (TestVectorsCurrent fails
// when they are out of date), and the host test runner (test/host.c) runs
// them, with the flash tear tests, under AddressSanitizer and UBSan. The
// same runner runs on QEMU's Cortex-M3 and M4 (mcu/, TestMCUConformance,
// with the measured peak stack), TestMCUSize measures the library's flash
// in a linked firmware image, and TestCFuzzProcess runs the libFuzzer
// target fuzz/fuzz_process.c. The operator's resets (src/efs_reset.c) have
// their own vectors in the same header, from a devices/shim with the
// operator's root.
//
// efsdev's trust (linux/trust.c: trust updates, certificates, revocation
// lists) is pinned by testdata/trust_vectors.h (TestTrustVectorsCurrent,
// decided by fence/auth; TestTrustConformance runs them) and fuzzed by
// fuzz/fuzz_trust.c (TestCFuzzTrust).
//
// The firmware job (include/efshim_fw.h, src/efs_fw*.c: devices/fwjob's
// state machine, A/B slots and boot loader on raw flash) is pinned the same
// way: TestFwVectorsCurrent writes testdata/fw_vectors.h from scenarios run
// through the Go devices/fwjob, and TestFirmwareJobHost runs them, with
// power cuts through every step of a job, in test/fw_host.c.
//
// There is no Go API here.
package firmware

//go:generate go test -run TestVectorsCurrent|TestFwVectorsCurrent|TestTrustVectorsCurrent -update .
