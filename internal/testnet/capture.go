package testnet

import (
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// Capture writes every frame that the interface dev of namespace ns sends or receives to file, in
// the pcap format (for a person reading a failing or slow test; this machine has no tcpdump),
// until the test ends.
func Capture(tb testing.TB, ns, dev, file string) {
	tb.Helper()
	var fd int
	var err error
	In(tb, ns, func() {
		var ifi *net.Interface
		if ifi, err = net.InterfaceByName(dev); err != nil {
			return
		}
		if fd, err = syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(syscall.ETH_P_ALL))); err != nil {
			return
		}
		if err = syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return
		}
		// A read returns at least every 100 ms, so that the capture sees the test end.
		err = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Usec: 100_000})
	})
	if err != nil {
		tb.Fatalf("capturing %s in %s: %v", dev, ns, err)
	}
	out, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	// The global header: magic (microseconds), version 2.4, no zone, snap length, Ethernet.
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(hdr[4:], 2)
	binary.LittleEndian.PutUint16(hdr[6:], 4)
	binary.LittleEndian.PutUint32(hdr[16:], 65535)
	binary.LittleEndian.PutUint32(hdr[20:], 1)
	if _, err := out.Write(hdr); err != nil {
		tb.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		rec := make([]byte, 16)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, _, err := syscall.Recvfrom(fd, buf, 0)
			if err == syscall.EAGAIN || err == syscall.EINTR {
				continue
			}
			if err != nil {
				return
			}
			now := time.Now()
			binary.LittleEndian.PutUint32(rec[0:], uint32(now.Unix()))
			binary.LittleEndian.PutUint32(rec[4:], uint32(now.Nanosecond()/1000))
			binary.LittleEndian.PutUint32(rec[8:], uint32(n))
			binary.LittleEndian.PutUint32(rec[12:], uint32(n))
			_, _ = out.Write(rec)
			_, _ = out.Write(buf[:n])
		}
	}()
	tb.Cleanup(func() {
		close(stop)
		<-done
		_ = syscall.Close(fd)
		_ = out.Close()
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
