package sandbox

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel terminate the broker if this process
// dies without closing it, so a crashed test leaves no mosquitto behind.
// Linux ties the signal to the forking thread; Go retires threads only when
// a goroutine exits while locked to one, which sandbox users do not do.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
