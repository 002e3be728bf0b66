//go:build !linux

package lockstepd

import "syscall"

// bindToDevice is Linux's SO_BINDTODEVICE; elsewhere the sockets follow the routes.
func bindToDevice(string) func(network, address string, c syscall.RawConn) error { return nil }
