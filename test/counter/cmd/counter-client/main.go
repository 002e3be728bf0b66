// Command counter-client asks the test guest's counter (test/counter) again and again from a
// network namespace, checks every reply, and prints one line per request:
//
//	<unix ms> ok count=N bootid=ID disk=count=N from=ADDR [by=N-1@ADDR,...]
//	<unix ms> unanswered <error>
//	<unix ms> VIOLATION <what>
//
// It exits 1 at the first violation. The demo (hack/demo.sh) runs it in the local cluster's
// client namespace.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lockstep-dev/lockstep/test/counter"
)

func main() {
	ns := flag.String("netns", "", "Network namespace to ask from (empty: this one).")
	addr := flag.String("addr", "", "The VM's address (ip, or ip:port).")
	every := flag.Duration("interval", 100*time.Millisecond, "Pause between a reply and the next request.")
	flag.Parse()
	target := *addr
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = fmt.Sprintf("%s:%d", target, counter.Port)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var c counter.Checker
	for ctx.Err() == nil {
		r, err := counter.Ask(ctx, *ns, target)
		now := time.Now().UnixMilli()
		if err != nil {
			c.Failed()
			fmt.Printf("%d unanswered %v\n", now, err)
			time.Sleep(*every)
			continue
		}
		if err := c.Check(r); err != nil {
			fmt.Printf("%d VIOLATION %v\n", now, err)
			os.Exit(1)
		}
		by := ""
		if r.By != "" {
			by = " by=" + r.By
		}
		fmt.Printf("%d ok count=%d bootid=%s disk=count=%d from=%s%s\n", now, r.Count, r.BootID, r.Disk, r.From, by)
		time.Sleep(*every)
	}
}
