// Package qmp is a client of the QEMU Machine Protocol: the COLO engine of lockstepd drives the
// primary's and the secondary's QEMU through it (start COLO, read checkpoint timing, fail over).
// One connection carries commands, matched to their replies by id, and the events QEMU sends on
// its own (COLO_EXIT, STOP, ...).
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Event is an asynchronous message from QEMU.
type Event struct {
	Name      string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Error is QEMU's answer to a command that failed.
type Error struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// ErrClosed is returned for commands on a closed connection (or one QEMU closed: it exited).
var ErrClosed = errors.New("qmp connection closed")

// Conn is a QMP connection in command mode.
type Conn struct {
	conn   net.Conn
	events chan Event

	writeMu sync.Mutex
	mu      sync.Mutex
	next    uint64
	waiting map[string]chan reply
	err     error
	done    chan struct{}
}

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
}

type message struct {
	ID     string          `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	QMP    json.RawMessage `json:"QMP"`
}

// Dial connects to QEMU's QMP socket (a Unix socket path), reads the greeting and enters command
// mode.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return New(ctx, nc)
}

// DialWhenUp dials the QMP socket at path until QEMU answers: QEMU creates the socket some time
// after it starts. It gives up when ctx ends or when exited is closed (QEMU died first).
func DialWhenUp(ctx context.Context, path string, exited <-chan struct{}) (*Conn, error) {
	for {
		q, err := Dial(ctx, path)
		if err == nil {
			return q, nil
		}
		select {
		case <-exited:
			return nil, errors.New("QEMU exited before its QMP socket answered")
		case <-ctx.Done():
			return nil, fmt.Errorf("QMP %s: %w", path, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// New runs QMP over an established connection.
func New(ctx context.Context, nc net.Conn) (*Conn, error) {
	c := &Conn{conn: nc, events: make(chan Event, 256), waiting: map[string]chan reply{}, done: make(chan struct{})}
	r := bufio.NewReaderSize(nc, 64<<10)
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	line, err := r.ReadBytes('\n')
	stop()
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("reading the QMP greeting: %w", err)
	}
	var greeting message
	if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
		_ = nc.Close()
		return nil, fmt.Errorf("not a QMP greeting: %q", line)
	}
	go c.read(r)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// read dispatches replies to their commands and events to Events, until the connection ends.
func (c *Conn) read(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		if line, err = r.ReadBytes('\n'); err != nil {
			break
		}
		var m message
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if m.Event != "" {
			var ev Event
			if json.Unmarshal(line, &ev) == nil {
				select {
				case c.events <- ev:
				default: // nobody reads events fast enough: drop rather than block replies
				}
			}
			continue
		}
		c.mu.Lock()
		ch := c.waiting[m.ID]
		delete(c.waiting, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- reply{Return: m.Return, Error: m.Error}
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	for id, ch := range c.waiting {
		close(ch)
		delete(c.waiting, id)
	}
	c.mu.Unlock()
	close(c.done)
	close(c.events)
}

// Execute runs a command with arguments (nil for none) and decodes its return value into result
// (nil to ignore it).
func (c *Conn) Execute(ctx context.Context, command string, args any, result any) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.next++
	id := strconv.FormatUint(c.next, 10)
	ch := make(chan reply, 1)
	c.waiting[id] = ch
	c.mu.Unlock()

	req := map[string]any{"execute": command, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return c.closedErr()
		}
		if r.Error != nil {
			r.Error.Command = command
			return r.Error
		}
		if result != nil && len(r.Return) > 0 {
			return json.Unmarshal(r.Return, result)
		}
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
		return ctx.Err()
	}
}

func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// HMP runs a human monitor command (some COLO steps exist only there, e.g. drive_add) and
// returns its output.
func (c *Conn) HMP(ctx context.Context, cmdline string) (string, error) {
	var out string
	err := c.Execute(ctx, "human-monitor-command", map[string]any{"command-line": cmdline}, &out)
	return out, err
}

// Events delivers QEMU's events; it is closed when the connection ends.
func (c *Conn) Events() <-chan Event { return c.events }

// Done is closed when the connection ended (QEMU exited, or Close).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Close closes the connection.
func (c *Conn) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
