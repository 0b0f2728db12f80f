# edgefence — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
DIST := dist
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# grpcnotrace keeps golang.org/x/net/trace (and with it html/template, whose
# reflection turns off the linker's dead-code removal of methods) out of the
# binaries: 17.2 MB -> 14.1 MB stripped on arm64. grpc tracing is off by default
# anyway. cmd/edgefence's TestDependencies reads this line.
GOTAGS := grpcnotrace
# What ships (cross, package) is also built without net/http's bundled HTTP/2
# (nethttpomithttp2; -0.5 MB): the agent's HTTP is HTTP/1.1 (the API socket,
# /metrics, image downloads) and gRPC to etcd has its own HTTP/2. Tests and
# bin/ keep it: the embedded etcd they run serves gRPC over TLS through
# net/http. cmd/edgefence's TestRunTLS runs a build with these tags against
# that etcd and a TLS broker; TestDependencies, TestBinarySize and deploy's
# TestCrossQemu read this line, and edgefence-bench builds the agent with it.
SHIPTAGS := $(GOTAGS),nethttpomithttp2
# edgefence_unsafe compiles the failpoints in (EDGEFENCE_FAILPOINTS, devsim's
# --unsafe-no-fence): test and demo builds only. `build` (bin/, what demo and
# chaos run) and `test` use it; `cross` and `package` (what ships) do not, and
# cmd/edgefence's TestShippedBinaryHasNoFailpoints checks they carry none.
# edgefence_pprof compiles Go's profiler in (metrics.pprof; about 0.3 MB, over the
# shipped arm64 binary's 16 MB budget): test, demo and profiling builds only.
UNSAFETAGS := $(GOTAGS),edgefence_unsafe,edgefence_pprof
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
CMDS := edgefence edgefence-devsim edgefence-sandbox edgefence-chaos
# The agent and the device simulator are what ships to gateways and devices;
# the sandbox (embedded etcd + broker) is for demos and tests only.
CROSS_CMDS := edgefence edgefence-devsim
TEST_TIMEOUT ?= 15m

.PHONY: help build efsdev test test-short deps lint tidy-check bench bench-e2e bench-mcu-verify demo demo-firmware chaos cross package fuzz clean

help: ## show this help
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## test/demo build (failpoints compiled in) of the agent, the device simulator, the sandbox and chaos into bin/
	@mkdir -p $(BIN)
	$(GO) build -tags $(UNSAFETAGS) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

deps: ## install what the tests need (Mosquitto and mosquitto_pub for interop and forgery tests, Debian's etcd 3.4 and etcdctl for the recovery tests, systemd-analyze to verify the unit, qemu-user-static for the arm smoke test, python3-pymodbus, socat and mbpoll for the Modbus tests, gcc, cppcheck and libmbedtls-dev for the C firmware shim, gcc-arm-none-eabi, newlib and qemu-system-arm for it on Cortex-M and mbedTLS 2.28.3's source for its signed vectors there (fetched once into ~/.cache/edgefence), clang and libFuzzer for its fuzzer, libmosquitto-dev for the C device)
	@if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ] || ! command -v mosquitto_pub >/dev/null; then \
		if command -v apt-get >/dev/null; then \
			echo "installing mosquitto and mosquitto-clients (apt-get; mosquitto_pub is the forgery tests' forger)"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto mosquitto-clients >/dev/null; \
		else \
			echo "mosquitto not found and no apt-get: Mosquitto interop tests will be skipped (they fail under CI=true)"; \
		fi; \
	fi
	@if [ ! -x /usr/bin/etcd ] || [ ! -x /usr/bin/etcdctl ]; then \
		if command -v apt-get >/dev/null; then \
			echo "installing etcd-server and etcd-client (apt-get) for the recovery tests on Debian's etcd"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server etcd-client >/dev/null; \
		else \
			echo "etcd/etcdctl not in /usr/bin and no apt-get: the tests on Debian's etcd are skipped (they fail under CI=true)"; \
		fi; \
	fi
	@if ! command -v systemd-analyze >/dev/null; then \
		if command -v apt-get >/dev/null; then \
			echo "installing systemd (apt-get) for systemd-analyze"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq systemd >/dev/null; \
		else \
			echo "systemd-analyze not found and no apt-get: the unit check is skipped (it fails under CI=true)"; \
		fi; \
	fi
	@if ! /usr/bin/python3 -c 'import pymodbus.server.async_io, serial_asyncio' 2>/dev/null || ! command -v mbpoll >/dev/null || ! command -v socat >/dev/null; then \
		if command -v apt-get >/dev/null; then \
			echo "installing python3-pymodbus, socat and mbpoll (apt-get) for the Modbus tests (pymodbus the slave, mbpoll the independent master)"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq python3-pymodbus socat mbpoll >/dev/null; \
		else \
			echo "pymodbus (under /usr/bin/python3), mbpoll or socat not found and no apt-get: the Modbus tests are skipped (they fail under CI=true)"; \
		fi; \
	fi
	@if ! command -v qemu-aarch64-static >/dev/null || ! command -v qemu-arm-static >/dev/null; then \
		if command -v apt-get >/dev/null; then \
			echo "installing qemu-user-static (apt-get) for the arm64/armv7/armv6 smoke test"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq qemu-user-static >/dev/null; \
		else \
			echo "qemu-user-static not found and no apt-get: the arm smoke test is skipped (it fails under CI=true)"; \
		fi; \
	fi

	@if ! command -v gcc >/dev/null || ! command -v cppcheck >/dev/null || [ ! -f /usr/include/mbedtls/ecdsa.h ]; then \
		if command -v apt-get >/dev/null; then \
			echo "installing gcc, cppcheck and libmbedtls-dev (apt-get) for the C firmware shim's host tests (devices/firmware)"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc libc6-dev cppcheck libmbedtls-dev >/dev/null; \
		else \
			echo "gcc, cppcheck or libmbedtls-dev not found and no apt-get: the C firmware shim's tests are skipped (they fail under CI=true)"; \
		fi; \
	fi
	@if ! command -v arm-none-eabi-gcc >/dev/null || [ ! -f /usr/lib/arm-none-eabi/newlib/libc_nano.a ] || ! command -v qemu-system-arm >/dev/null || \
		! command -v clang >/dev/null || [ ! -f "$$(clang -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-$$(uname -m).a" ]; then \
		if command -v apt-get >/dev/null; then \
			echo "installing gcc-arm-none-eabi, libnewlib-arm-none-eabi, qemu-system-arm, clang and libFuzzer (apt-get) for the C firmware shim on Cortex-M and its fuzzer (devices/firmware)"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm clang libclang-rt-14-dev libfuzzer-14-dev >/dev/null; \
		else \
			echo "arm-none-eabi-gcc, newlib, qemu-system-arm or clang's libFuzzer not found and no apt-get: the Cortex-M and fuzz tests of devices/firmware are skipped (they fail under CI=true)"; \
		fi; \
	fi

	@if ! command -v curl >/dev/null; then \
		if command -v apt-get >/dev/null; then \
			echo "installing curl (apt-get) to fetch mbedTLS's source for the Cortex-M signed vectors"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq curl ca-certificates >/dev/null; \
		fi; \
	fi
	@# mbedTLS's source (Debian ships it only as a source package): the Cortex-M
	@# runner's crypto port for the signed vectors. Once, into the user's cache,
	@# checked by its pinned SHA-256; a no-op when it is there.
	@sh devices/firmware/mcu/mbedtls.sh fetch

	@if [ ! -f /usr/include/mosquitto.h ]; then \
		if command -v apt-get >/dev/null; then \
			echo "installing libmosquitto-dev (apt-get) for the C device (devices/firmware/linux: efsdev, run by the Figure 1 and kill -9 tests)"; \
			SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libmosquitto-dev >/dev/null; \
		else \
			echo "libmosquitto-dev not found and no apt-get: the C device's tests are skipped (they fail under CI=true)"; \
		fi; \
	fi

lint: tidy-check ## go.mod tidy, gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(UNSAFETAGS) ./...
	$(GO) run $(STATICCHECK) ./...

# go mod tidy -diff (Go 1.23+) prints what tidy would change and exits 1;
# stdout only: stderr carries its "go: downloading" lines.
tidy-check: ## fail if go.mod or go.sum differ from what go mod tidy makes
	@out=$$($(GO) mod tidy -diff); rc=$$?; \
		if [ $$rc != 0 ] || [ -n "$$out" ]; then echo "go.mod/go.sum not tidy (run go mod tidy):"; echo "$$out"; exit 1; fi

test: deps lint ## lint, then every test with the race detector (what CI runs)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags $(UNSAFETAGS) ./...
	@# The shipped build's side of the switches: it refuses them.
	$(GO) test -count=1 -tags $(GOTAGS) -run 'Unsafe.*Refused' ./agent/ ./agent/bridge/

test-short: ## unit tests only, no servers, no race detector
	$(GO) test -short -count=1 ./...

bench: ## Go benchmarks of every package (figures go to docs/BENCHMARKS.md)
	$(GO) test -run='^$$' -bench=. -benchmem -count=1 ./...

bench-e2e: ## end-to-end figures: command round trip (mochi, Mosquitto), 1,000 locks, agent RSS by fleet size, cold start and SIGTERM
	$(GO) run ./cmd/edgefence-bench all

bench-mcu-verify: ## the ES256 verify a microcontroller fence point pays: mbedTLS on QEMU Cortex-M3/M4, instructions counted (needs gcc-arm-none-eabi, qemu-system-arm, libmbedtls-dev, mbedTLS source: make deps)
	sh devices/firmware/bench/ecdsa/run.sh

demo: build ## replay the article's Figure 1 on real etcd, MQTT and devices (thermostats, then a PLC on an RS-485 line), and narrate it
	$(BIN)/edgefence-sandbox demo --bin $(BIN)

demo-firmware: build ## a firmware update over two gateways: the holder frozen mid-download, the other resumes, the late chunk and activate refused
	$(BIN)/edgefence-sandbox demo firmware --bin $(BIN)

ROUNDS ?= 30
efsdev: ## the C device (devices/firmware/linux on libmosquitto) into bin/efsdev; e.g. make chaos CHAOSFLAGS='--c-device bin/efsdev'
	@mkdir -p $(BIN)
	$${CC:-cc} -std=c99 -Wall -Wextra -Werror -pedantic -O2 -Idevices/firmware/include -Idevices/firmware/linux \
		-o $(BIN)/efsdev devices/firmware/linux/*.c devices/firmware/src/*.c -lmosquitto -lmbedcrypto -lm

chaos: build ## ROUNDS randomized fault-injection rounds on the real binaries (default 30); prints a summary, fails on any violation
	$(BIN)/edgefence-chaos --rounds $(ROUNDS) --bin $(BIN) $(CHAOSFLAGS)

# Gateway targets, ARCHS names: arm64, armv7 (GOARM=7, Debian armhf), armv6
# (GOARM=6, a Pi Zero/1), amd64.
ARCHS ?= arm64 armv7 armv6 amd64

cross: ## static gateway builds for ARCHS (arm64 armv7 armv6 amd64; CGO off, trimpath, version+commit stamped) into dist/
	@mkdir -p $(DIST)
	@for a in $(ARCHS); do \
		case $$a in arm64|amd64) arch=$$a arm= ;; armv7|armv6) arch=arm arm=$${a#armv} ;; \
		*) echo "unknown arch $$a (ARCHS: arm64 armv7 armv6 amd64)"; exit 2 ;; esac; \
		for c in $(CROSS_CMDS); do out=$(DIST)/$$c-linux-$$a; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch GOARM=$$arm $(GO) build -tags $(SHIPTAGS) -trimpath -ldflags "$(LDFLAGS)" -o $$out ./cmd/$$c || exit 1; \
		ls -l $$out; done; done

# Debian packages: edgefence (agent, unit, conffile; deploy/nfpm.yaml) and
# edgefence-devsim (deploy/nfpm-devsim.yaml) for each of ARCHS, from the
# binaries `cross` built. Debian architectures: arm64, amd64; armv7 is
# armhf. armv6 is armhf too, not armel: Raspberry Pi OS, the system of a Pi
# Zero/1, calls itself armhf (ARMv6 + VFP) and would refuse an armel
# package, while Debian's armel is ARMv5 soft-float, where a GOARM=6 binary
# may hit VFP instructions the CPU lacks. Its file is *_armhf-armv6.deb.
NFPM := github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DEB_VERSION = $(shell sh deploy/debversion.sh '$(VERSION)')
MAINTAINER ?= edgefence maintainers <maintainers@edgefence.invalid>
# Reproducible file times inside the packages: the commit's time.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

package: cross ## .deb packages (edgefence, edgefence-devsim) for ARCHS into dist/; deploy/nfpm*.yaml
	@v='$(DEB_VERSION)'; for a in $(ARCHS); do \
		case $$a in armv7) deb=armhf file=armhf ;; armv6) deb=armhf file=armhf-armv6 ;; *) deb=$$a file=$$a ;; esac; \
		for p in edgefence edgefence-devsim; do cfg=deploy/nfpm.yaml; [ $$p = edgefence ] || cfg=deploy/nfpm-devsim.yaml; \
		out=$(DIST)/$${p}_$${v}_$$file.deb; \
		DEB_ARCH=$$deb DEB_VERSION=$$v BINDIR=$(DIST) TARGET=$$a MAINTAINER='$(MAINTAINER)' SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
			$(GO) run $(NFPM) package --config $$cfg --packager deb --target $$out >/dev/null || exit 1; \
		ls -l $$out; done; done

fuzz: ## run every package's fuzz targets, and the C firmware shim's libFuzzer target, each for FUZZTIME (default 30s); make test runs their seed corpora
	@for p in $$($(GO) list ./...); do \
		for t in $$($(GO) test -tags $(UNSAFETAGS) -list 'Fuzz.*' $$p | grep ^Fuzz); do \
			echo "$$p $$t"; \
			$(GO) test -tags $(UNSAFETAGS) -run='^$$' -fuzz="^$$t$$" -fuzztime=$${FUZZTIME:-30s} $$p || exit 1; done; done
	@echo "./devices/firmware fuzz/fuzz_process.c, fuzz/fuzz_fw.c and fuzz/fuzz_trust.c (libFuzzer)"
	EFS_FUZZTIME=$${FUZZTIME:-30s} $(GO) test -count=1 -v -run '^TestCFuzz(Process|FirmwareJob|Trust)$$' -timeout 0 ./devices/firmware/

clean: ## remove build output
	rm -rf $(BIN) $(DIST)
