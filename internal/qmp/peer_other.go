//go:build !linux

package qmp

// PeerPID is 0 where SO_PEERCRED does not exist.
func (c *Conn) PeerPID() int { return 0 }
