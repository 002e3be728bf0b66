package apps

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Shell runs commands in the guest over SSH, as the cloud-init user whose key it holds.
type Shell struct {
	Dial DialFunc
	Addr string // the guest's sshd, host:port
	User string
	key  ssh.Signer
}

// NewShell makes a key for user; AuthorizedKey is what cloud-init's data gives the user.
func NewShell(dial DialFunc, addr, user string) (*Shell, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	return &Shell{Dial: dial, Addr: addr, User: user, key: signer}, nil
}

// AuthorizedKey is the shell's public key, in authorized_keys form.
func (s *Shell) AuthorizedKey() string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.key.PublicKey())))
}

// Run runs command in a new session (a new connection: a failover may have come between two)
// and returns what it printed.
func (s *Shell) Run(ctx context.Context, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := s.Dial(ctx, "tcp", s.Addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	c, chans, reqs, err := ssh.NewClientConn(conn, s.Addr, &ssh.ClientConfig{
		User: s.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(s.key)},
		// The guest's host key is made at its first boot; the connection runs inside the
		// test's own network namespace.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		return "", err
	}
	client := ssh.NewClient(c, chans, reqs)
	defer func() { _ = client.Close() }()
	session, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer func() { _ = session.Close() }()
	var out, errOut bytes.Buffer
	session.Stdout, session.Stderr = &out, &errOut
	if err := session.Run(command); err != nil {
		return out.String(), fmt.Errorf("%q in the guest: %w: %s", command, err, errOut.String())
	}
	return out.String(), nil
}
