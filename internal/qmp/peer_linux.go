//go:build linux

package qmp

import (
	"net"
	"syscall"
)

// PeerPID is the process id of the QEMU at the other end of the monitor socket (SO_PEERCRED), as
// this process's PID namespace sees it: 0 when it cannot see it (lockstepd outside the host's
// PID namespace).
func (c *Conn) PeerPID() int {
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}
