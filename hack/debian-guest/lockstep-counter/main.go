// Command lockstep-counter is the counter of lockstep's Debian test guest (hack/debian-guest.sh), a
// systemd service. It speaks the busybox guest's protocol (hack/guest/init, test/counter): each
// request (one line) increments the count, writes "count=N" to sector 0 of the data partition,
// flushes it to the disk, and only then replies "count=N bootid=ID disk=<sector 0> by=<the counts
// before, each with the client address that made it>": a client that sees the count skip learns
// which connection made the count it did not see. It listens on IPv4 and IPv6. At start it goes
// on from the count the partition holds, so a VM restarted from its disk goes on from there with
// a new boot id.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const sector = 512

// history is how many of the last counts a reply names with the address that made each.
const history = 4

type service struct {
	mu     sync.Mutex
	data   *os.File
	count  int
	bootID string
	by     []string // "N@addr" for the last counts, newest first
}

func main() {
	listen := flag.String("listen", ":7777", "address to serve the counter on (\":port\" is IPv4 and IPv6)")
	data := flag.String("data", "/dev/disk/by-partlabel/counter", "the data partition, whose sector 0 holds the count")
	flag.Parse()
	c, err := open(*data)
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serving the counter on %s from %d, boot id %s", l.Addr(), c.count, c.bootID)
	log.Fatal(c.serveAll(l))
}

// serveAll serves each connection of l.
func (c *service) serveAll(l net.Listener) error {
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		go c.serve(conn)
	}
}

// open opens the data partition, waiting for it: the service may start before udev has made the
// partition's link.
func open(path string) (*service, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nil, err
	}
	var f *os.File
	for i := 0; ; i++ {
		if f, err = os.OpenFile(path, os.O_RDWR, 0); err == nil || i == 300 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	c := &service{data: f, bootID: strings.TrimSpace(string(boot))}
	held, err := c.read()
	if err != nil {
		return nil, err
	}
	if n, ok := strings.CutPrefix(held, "count="); ok {
		c.count, _ = strconv.Atoi(n)
	}
	return c, nil
}

// read is the first line of sector 0.
func (c *service) read() (string, error) {
	b := make([]byte, sector)
	if _, err := c.data.ReadAt(b, 0); err != nil {
		return "", err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(bytes.TrimRight(line, "\x00")), nil
}

func (c *service) serve(conn net.Conn) {
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
		return
	}
	reply, err := c.next(conn.RemoteAddr().String())
	if err != nil {
		log.Print(err)
		return
	}
	_, _ = conn.Write([]byte(reply))
}

// next counts one request from the client at from: the write reaches the disk before the reply
// is made.
func (c *service) next(from string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.count + 1
	b := make([]byte, sector)
	copy(b, fmt.Sprintf("count=%d\n", n))
	if _, err := c.data.WriteAt(b, 0); err != nil {
		return "", err
	}
	if err := c.data.Sync(); err != nil {
		return "", err
	}
	c.count = n
	held, err := c.read()
	if err != nil {
		return "", err
	}
	before := strings.Join(c.by, ",")
	if before == "" {
		before = "-"
	}
	c.by = append([]string{fmt.Sprintf("%d@%s", n, from)}, c.by...)
	if len(c.by) > history {
		c.by = c.by[:history]
	}
	return fmt.Sprintf("count=%d bootid=%s disk=%s by=%s\n", n, c.bootID, held, before), nil
}
