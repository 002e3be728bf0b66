package kubevirtcontrol

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// Component is a KubeVirt component running as a process.
type Component struct {
	// Dir holds what the caller put there for it (certificates); Log is its output.
	Dir, Log string
	// Port is where it listens, on loopback.
	Port int
	// Exited is closed once the process has ended; Err then says how.
	Exited chan struct{}
	Err    error
	cmd    *exec.Cmd
	out    *os.File
}

// Start runs the KubeVirt component name (a binary in bin) with the API server access of
// kubeconfig, the arguments and environment of the strategy's Deployment, its port moved to a
// free one on loopback, and the arguments that extra returns for dir (certificates it wrote
// there, say). The process dies with the caller's (PDEATHSIG).
func Start(s Strategy, bin, name, kubeconfig, dir string, extra func(dir string) ([]string, error)) (*Component, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	args, env, err := s.DeploymentCommand(name)
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	setArg(args, "--port", strconv.Itoa(port))
	args = append(args, "--listen", "127.0.0.1", "--kubeconfig", kubeconfig)
	if extra != nil {
		more, err := extra(dir)
		if err != nil {
			return nil, err
		}
		args = append(args, more...)
	}
	c := &Component{Dir: dir, Log: filepath.Join(dir, name+".log"), Port: port, Exited: make(chan struct{})}
	if c.out, err = os.OpenFile(c.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return nil, err
	}
	c.cmd = exec.Command(filepath.Join(bin, name), args...)
	c.cmd.Env, c.cmd.Stdout, c.cmd.Stderr = append(os.Environ(), env...), c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		_ = c.out.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		c.Err = c.cmd.Wait()
		_ = c.out.Close()
		close(c.Exited)
	}()
	return c, nil
}

// Stop kills the process and waits for it.
func (c *Component) Stop() {
	_ = c.cmd.Process.Kill()
	<-c.Exited
}

// setArg sets the value that follows flag in args, if it is there.
func setArg(args []string, flag, value string) {
	for i := range args {
		if args[i] == flag && i+1 < len(args) {
			args[i+1] = value
		}
	}
}

// FreePort is a TCP port free on loopback now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
