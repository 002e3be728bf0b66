//go:build fullstack

package fullstack

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/test/counter"
)

// client asks the VM's counter from the client namespace until stopped, checking every reply
// (test/counter.Checker: never back, never a value lost, never a reboot, the disk in step).
type client struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	checker    counter.Checker
	replies    []counter.Reply
	violations []string
}

func startClient(addr string) *client {
	ctx, cancel := context.WithCancel(context.Background())
	c := &client{addr: addr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			r, err := counter.Ask(ctx, clientNS(), c.addr)
			c.mu.Lock()
			if err != nil {
				c.checker.Failed()
			} else {
				if err := c.checker.Check(r); err != nil {
					c.violations = append(c.violations, fmt.Sprintf("%s at %s", err, r.At.Format("15:04:05.000")))
				}
				c.replies = append(c.replies, r)
			}
			c.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return c
}

func (c *client) stop() {
	c.cancel()
	<-c.done
}

// Violations are what the client saw that FT forbids.
func (c *client) Violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.violations...)
}

// Last is the last reply (zero if none).
func (c *client) Last() counter.Reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.replies) == 0 {
		return counter.Reply{}
	}
	return c.replies[len(c.replies)-1]
}

// Around is the last reply before t and the first after it (zero when there is none yet).
func (c *client) Around(t time.Time) (before, after counter.Reply) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.replies {
		if r.At.Before(t) {
			before = r
		} else if after.At.IsZero() {
			after = r
		}
	}
	return before, after
}

// Count is the number of replies so far.
func (c *client) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.replies)
}

type counterReply = counter.Reply
