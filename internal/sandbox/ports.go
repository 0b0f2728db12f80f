package sandbox

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
)

// FreePort asks the kernel for a free TCP port on 127.0.0.1 and returns it
// after closing the probe listener. Another process may take the port before
// the caller binds it; starters that pick ports themselves retry on
// EADDRINUSE.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("sandbox: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// resolveAddr turns "", "HOST:0", ":PORT" or "HOST:PORT" into a concrete
// "HOST:PORT": an empty host means 127.0.0.1, port 0 (or an empty addr)
// means a free port. picked reports whether the port was chosen here.
func resolveAddr(addr string) (resolved string, picked bool, err error) {
	host, port := "127.0.0.1", "0"
	if addr != "" {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return "", false, fmt.Errorf("sandbox: address %q: %w", addr, err)
		}
		if h != "" {
			host = h
		}
		if p != "" {
			port = p
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "", false, fmt.Errorf("sandbox: address %q: bad port", addr)
	}
	if n == 0 {
		if n, err = FreePort(); err != nil {
			return "", false, err
		}
		picked = true
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), picked, nil
}

// addrInUse reports whether err says a listen address was taken. etcd does
// not always wrap the syscall error, hence the string fallback.
func addrInUse(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return true
	}
	return strings.Contains(strings.ToLower(err.Error()), "address already in use")
}
