/*
 * Startup for QEMU's mps2-an385/an386 (Cortex-M3/M4) with the linker script
 * bench/ecdsa/mps2.ld: the vector table, .data copied, .bss zeroed, then
 * _exit(main()). A fault exits with EFS_BOARD_FAULT. The program provides
 * main and _exit (by semihosting on QEMU; libnosys's loops forever).
 * Shared by mcu/runner.c, mcu/size.c and bench/ecdsa.
 */
#include <stdint.h>
#include <string.h>

#define EFS_BOARD_FAULT 127

int main(void);
void _exit(int code);
void Reset_Handler(void);

extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss, _estack;

static void Fault_Handler(void)
{
	_exit(EFS_BOARD_FAULT);
}

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
	(void (*)(void))&_estack, Reset_Handler, Fault_Handler, Fault_Handler,
	Fault_Handler, Fault_Handler, Fault_Handler,
};

void Reset_Handler(void)
{
	memcpy(&_sdata, &_sidata, (size_t)((uintptr_t)&_edata - (uintptr_t)&_sdata));
	memset(&_sbss, 0, (size_t)((uintptr_t)&_ebss - (uintptr_t)&_sbss));
	_exit(main());
}
