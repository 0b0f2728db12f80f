#!/bin/sh
# The verify cost a fence point pays on a microcontroller, measured:
# mbedTLS 2.28 (Debian's source) verifying one ES256-signed edgefence
# command, built for Cortex-M3 and Cortex-M4 and run on QEMU's mps2-an385
# and mps2-an386 with -icount shift=0 (instructions counted exactly), and
# on the host against Debian's libmbedcrypto. Needs gcc-arm-none-eabi,
# libnewlib-arm-none-eabi, qemu-system-arm, libmbedtls-dev, and the mbedTLS
# source: MBEDTLS_SRC=dir, or ../../mcu/mbedtls.sh's (Debian's orig tarball,
# fetched once into the user's cache by `make deps`, or here).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -z "${MBEDTLS_SRC:-}" ]; then
	sh "$here/../../mcu/mbedtls.sh" fetch
	MBEDTLS_SRC=$(sh "$here/../../mcu/mbedtls.sh" path)
fi
cd "$here"
gcc -O2 -Wall -Wextra -Werror -o "$out/host" verify.c host.c -lmbedcrypto
"$out/host"
L=$MBEDTLS_SRC/library
for pair in cortex-m3:mps2-an385 cortex-m4:mps2-an386; do
	cpu=${pair%%:*}
	board=${pair##*:}
	arm-none-eabi-gcc -mcpu="$cpu" -mthumb -O2 -ffunction-sections -fdata-sections -Wall -Wextra \
		-I. -I"$MBEDTLS_SRC/include" -DMBEDTLS_CONFIG_FILE='"mbedtls_config.h"' \
		--specs=nano.specs --specs=nosys.specs -nostartfiles -T mps2.ld -Wl,--gc-sections \
		-o "$out/$cpu.elf" ../../mcu/startup.c mcu.c verify.c "$L/bignum.c" "$L/ecp.c" "$L/ecp_curves.c" "$L/ecdsa.c" \
		"$L/sha256.c" "$L/asn1parse.c" "$L/asn1write.c" "$L/platform_util.c" "$L/constant_time.c" 2>/dev/null
	arm-none-eabi-size "$out/$cpu.elf" | sed "s|$out/||"
	timeout 300 qemu-system-arm -M "$board" -nographic -icount shift=0 \
		-semihosting-config enable=on,target=native -kernel "$out/$cpu.elf"
done
