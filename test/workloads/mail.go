package workloads

import (
	"context"
	"fmt"
	"net/smtp"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/test/apps"
)

// sendMail is the mail row (the Exchange paper's Send Mail): Postfix in the guest under a steady
// load from Postfix's smtp-source (two sessions, each sending a 2 KiB message a second), while a
// client submits a message every 250 ms and times each submission, from connecting to the 250
// that accepts the message (Postfix has written it to its queue on the data disk by then).
var sendMail = Workload{
	Name: "mail", Title: "Mail submission under load (Postfix, smtp-source at 2 messages/s, SMTP client)",
	Paper: "Exchange 2007 Send Mail (1600 heavy users): 95th percentile up slightly with FT, well under 500 ms with and without",
	Run: func(ctx context.Context, env Env) ([]Measure, error) {
		if env.SMTPSource == "" {
			return nil, fmt.Errorf("no smtp-source (hack/smtp-source.sh)")
		}
		loadCtx, stopLoad := context.WithCancel(ctx)
		load := env.Client(loadCtx, filepath.Join(env.SMTPSource, "usr/sbin/smtp-source"),
			"-s", "2", "-w", "1", "-m", "1000000", "-l", "2048", "-f", "load@client.invalid", "-t", apps.MailRecipient, env.Addr+":25")
		load.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(env.SMTPSource, "usr/lib/postfix"))
		var loadOut strings.Builder
		load.Stdout, load.Stderr = &loadOut, &loadOut
		if err := load.Start(); err != nil {
			stopLoad()
			return nil, fmt.Errorf("smtp-source: %w", err)
		}
		loadDone := make(chan error, 1)
		go func() { loadDone <- load.Wait() }()
		defer func() {
			stopLoad()
			<-loadDone
		}()

		messages := int(env.Span / (250 * time.Millisecond))
		if env.Brief {
			messages = 4
		}
		var took []float64
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := range max(messages, 1) {
			select {
			case err := <-loadDone:
				loadDone <- err
				return nil, fmt.Errorf("smtp-source ended: %v: %s", err, lastLine(loadOut.String()))
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-tick.C:
			}
			d, err := submit(ctx, env, i)
			if err != nil {
				return nil, fmt.Errorf("submitting message %d: %w", i, err)
			}
			took = append(took, d.Seconds()*1000)
		}
		sort.Float64s(took)
		return []Measure{
			{Name: "Send Mail p50", Unit: "ms", Value: percentile(took, 50)},
			{Name: "Send Mail p95", Unit: "ms", Value: percentile(took, 95), Goal: 1.2, Limit: 500},
		}, nil
	},
}

// submit sends one message and returns how long the server took to accept it, from connecting
// to its 250 after the data.
func submit(ctx context.Context, env Env, i int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := env.Dial(ctx, "tcp", env.Addr+":25")
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	c, err := smtp.NewClient(conn, env.Addr)
	if err != nil {
		return 0, err
	}
	if err := c.Hello("client.invalid"); err != nil {
		return 0, err
	}
	if err := c.Mail("probe@client.invalid"); err != nil {
		return 0, err
	}
	if err := c.Rcpt(apps.MailRecipient); err != nil {
		return 0, err
	}
	w, err := c.Data()
	if err != nil {
		return 0, err
	}
	body := fmt.Sprintf("Subject: lockstep's Send Mail probe %d\r\n\r\n%s\r\n", i, strings.Repeat("a line of the message, as a person writes one\r\n", 40))
	if _, err := w.Write([]byte(body)); err != nil {
		return 0, err
	}
	if err := w.Close(); err != nil { // the 250 (or a refusal)
		return 0, err
	}
	took := time.Since(start)
	_ = c.Quit()
	return took, nil
}
