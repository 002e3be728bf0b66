// Package vmdouble is a test double of a VM engine for lockstepd, standing in for QEMU (issue 5)
// in the data-plane tests: a VM whose whole state is a counter. As the primary it counts, logs
// every new value (each entry carries the whole state, so a new secondary needs no other
// snapshot) and then emits it as an output; as the secondary it applies the values it is sent.
// Every output carries its value, so that a test can check what clients saw against what the
// secondary held: nothing a client saw may be missing after a failover.
package vmdouble

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockstep-dev/lockstep/internal/engine"
	"github.com/lockstep-dev/lockstep/internal/ftlog"
)

// Counter is the double.
type Counter struct {
	// Name is carried in every output ("<name> <value>").
	Name string
	// Step is the pause between two values (0: as fast as the log allows).
	Step time.Duration
	// Emit sends an output; nil drops it. With Iface empty it is called once the gate releases
	// the output; with Iface set, it is called at once and the kernel gate holds the packet.
	Emit func(payload []byte)
	// Iface is the interface Emit's packets leave through, for the kernel gate ("" for none).
	Iface string
	// Trace, when set, gets a line per applied entry ("apply <seq> <value> <Monotonic()>"), per start as the
	// primary ("run <value>") and per stop ("stop"), each written at once.
	Trace io.Writer

	mu      sync.Mutex
	value   uint64
	stopped bool
	running sync.WaitGroup
	// step is held (a token in it) while Run counts, logs and emits one value: Pause takes it,
	// so that it returns only once the VM can produce nothing more.
	stepOnce sync.Once
	step     chan struct{}
	paused   bool
}

var (
	_ engine.Engine = (*Counter)(nil)
	_ engine.Pauser = (*Counter)(nil)
)

// Pause implements engine.Pauser: no value is counted or emitted until Resume.
func (c *Counter) Pause(ctx context.Context) error {
	select {
	case c.stepper() <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("the counter is still busy with a value: %w", ctx.Err())
	}
	defer func() { <-c.stepper() }()
	c.mu.Lock()
	c.paused = true
	c.mu.Unlock()
	c.trace("pause")
	return nil
}

// Resume implements engine.Pauser.
func (c *Counter) Resume(context.Context) error {
	c.mu.Lock()
	c.paused = false
	c.mu.Unlock()
	c.trace("resume")
	return nil
}

func (c *Counter) stepper() chan struct{} {
	c.stepOnce.Do(func() { c.step = make(chan struct{}, 1) })
	return c.step
}

// Paused says whether the VM is paused.
func (c *Counter) Paused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused
}

// Value is the counter.
func (c *Counter) Value() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.value
}

func (c *Counter) trace(format string, args ...any) {
	if c.Trace != nil {
		_, _ = fmt.Fprintf(c.Trace, format+"\n", args...)
	}
}

// Run implements engine.Engine.
func (c *Counter) Run(ctx context.Context, rec engine.Recorder) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return engine.ErrFenced
	}
	c.running.Add(1)
	v := c.value
	c.mu.Unlock()
	defer c.running.Done()
	c.trace("run %d", v)
	var tick <-chan time.Time
	if c.Step > 0 {
		t := time.NewTicker(c.Step)
		defer t.Stop()
		tick = t.C
	}
	for {
		if tick != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-tick:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		done, err := c.countOne(ctx, rec, &v)
		if done || err != nil {
			return err
		}
	}
}

// countOne counts, logs and emits the next value; a paused VM waits a moment instead. It says
// whether Run is done (stopped, or ctx ended), and why it failed.
func (c *Counter) countOne(ctx context.Context, rec engine.Recorder, v *uint64) (bool, error) {
	if c.Paused() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
		return ctx.Err() != nil, nil
	}
	select {
	case c.stepper() <- struct{}{}:
	case <-ctx.Done():
		return true, nil
	}
	defer func() { <-c.stepper() }()
	if c.Paused() {
		return false, nil // paused while it waited
	}
	next := *v + 1
	if _, err := rec.Append(ctx, binary.BigEndian.AppendUint64(nil, next)); err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return true, err
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return true, nil
	}
	c.value = next
	c.mu.Unlock()
	*v = next
	payload := Payload(c.Name, next)
	switch {
	case c.Emit == nil:
	case c.Iface != "":
		c.Emit(payload)
	default:
		rec.Output(func() { c.Emit(payload) })
	}
	return false, nil
}

// Resync implements engine.Engine: every entry carries the whole state already.
func (c *Counter) Resync() {}

// Apply implements engine.Engine.
func (c *Counter) Apply(e ftlog.Entry) error {
	if len(e.Data) != 8 {
		return fmt.Errorf("entry %d has %d bytes, want 8", e.Seq, len(e.Data))
	}
	v := binary.BigEndian.Uint64(e.Data)
	c.mu.Lock()
	c.value = v
	c.mu.Unlock()
	c.trace("apply %d %d %d", e.Seq, v, Monotonic())
	return nil
}

// Stop implements engine.Engine.
func (c *Counter) Stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.running.Wait()
	c.trace("stop")
}

// GateInterface implements engine.Engine.
func (c *Counter) GateInterface() string { return c.Iface }

// Monotonic is CLOCK_MONOTONIC in nanoseconds: one clock for every process and network
// namespace of the machine, so that a test orders what a secondary applied before what a
// client received.
func Monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Payload is an output's content.
func Payload(name string, v uint64) []byte { return fmt.Appendf(nil, "%s %d", name, v) }

// ParsePayload reads an output's content.
func ParsePayload(b []byte) (name string, v uint64, err error) {
	_, err = fmt.Sscanf(string(b), "%s %d", &name, &v)
	return name, v, err
}

// UDPEmitter sends outputs as UDP datagrams to addr.
func UDPEmitter(addr string) (func([]byte), error) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return nil, err
	}
	return func(b []byte) { _, _ = conn.Write(b) }, nil
}
