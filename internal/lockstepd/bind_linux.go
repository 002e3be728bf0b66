//go:build linux

package lockstepd

import "syscall"

// bindToDevice makes a socket send and receive on iface only (SO_BINDTODEVICE): the pairs'
// traffic never takes the node's other networks, even where the kernel would route it there once
// the logging network is down (a peer's logging address behind the default route, or answered
// on another interface).
func bindToDevice(iface string) func(network, address string, c syscall.RawConn) error {
	if iface == "" {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface)
		}); err != nil {
			return err
		}
		return serr
	}
}
