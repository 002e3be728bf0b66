package ftvmctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/scheme"
	"github.com/lockstep-dev/lockstep/internal/version"
)

const usage = `kubectl ftvm: lockstep's FaultTolerantVMs, as a person operates them.

  kubectl ftvm status [NAME] [-A]            the pairs: state, members, synchronized, resync, pause
  kubectl ftvm console NAME                  the serial console of the member that runs the VM (virtctl)
  kubectl ftvm test-failover NAME            the secondary takes over, and a new secondary is made
  kubectl ftvm restart-secondary NAME        a new secondary replaces the secondary
  kubectl ftvm migrate-secondary NAME [--node N]
                                             the secondary moves (to node N)
  kubectl ftvm protection NAME enabled|suspended|disabled
                                             spec.protection (suspended keeps the secondary's node)
  kubectl ftvm adopt VM --logging-network NET [-o yaml]
                                             a FaultTolerantVM takes VirtualMachine VM over, on its
                                             disks, with its firmware UUID and MACs (-o yaml: print it)
  kubectl ftvm release NAME                  the FaultTolerantVM goes back to a VirtualMachine of its
                                             name, on its current disks (onDelete Release, deleted)
  kubectl ftvm version

Flags (before or after the command's arguments): -n/--namespace, -A/--all-namespaces,
--kubeconfig, --context, --wait (operations and release: follow until done, e.g. --wait=10m; 0
returns at once).
The operations create a FaultTolerantVMOperation, which the operator runs once.
`

// Env is what the plugin runs against; tests give it a client of their own.
type Env struct {
	Out, Err io.Writer
	// Client makes the API client and says the namespace the kubeconfig names (nil: from the
	// kubeconfig, as kubectl finds it).
	Client func(kubeconfig, context string) (client.Client, string, error)
	// Exec replaces the plugin with a program (nil: syscall.Exec).
	Exec func(path string, args []string) error
	Now  func() time.Time
}

// options are the flags every command takes.
type options struct {
	namespace, kubeconfig, context, node string
	loggingNetwork, output               string
	all                                  bool
	wait                                 time.Duration
}

// commands are the commands besides the operations (operationTypes).
var commands = map[string]bool{"status": true, "console": true, "protection": true, "adopt": true, "release": true}

// Main runs the plugin with args (without the program's name) and returns its exit code.
func Main(args []string, env Env) int {
	if env.Client == nil {
		env.Client = kubeClient
	}
	if env.Exec == nil {
		env.Exec = func(path string, args []string) error { return syscall.Exec(path, args, os.Environ()) }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if err := run(args, env); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		_, _ = fmt.Fprintln(env.Err, "error:", err) // nowhere else to say it
		return 1
	}
	return 0
}

func run(args []string, env Env) error {
	o := options{}
	fs := flag.NewFlagSet("kubectl ftvm", flag.ContinueOnError)
	fs.SetOutput(env.Err)
	fs.Usage = func() { _, _ = fmt.Fprint(env.Err, usage) }
	for _, n := range []string{"n", "namespace"} {
		fs.StringVar(&o.namespace, n, "", "namespace")
	}
	for _, n := range []string{"A", "all-namespaces"} {
		fs.BoolVar(&o.all, n, false, "all namespaces")
	}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file")
	fs.StringVar(&o.context, "context", "", "kubeconfig context")
	fs.StringVar(&o.node, "node", "", "migrate-secondary: the node to move the secondary to")
	fs.DurationVar(&o.wait, "wait", 0, "operations and release: follow until done, at most this long")
	fs.StringVar(&o.loggingNetwork, "logging-network", "", "adopt: the FaultTolerantVM's logging network")
	for _, n := range []string{"o", "output"} {
		fs.StringVar(&o.output, n, "", "adopt: yaml prints the FaultTolerantVM instead of creating it")
	}
	words, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(words) == 0 {
		fs.Usage()
		return errors.New("a command is required")
	}
	cmd, rest := words[0], words[1:]
	if cmd == "version" {
		_, err := fmt.Fprintln(env.Out, "kubectl-ftvm", version.String())
		return err
	}
	if cmd == "help" {
		_, err := fmt.Fprint(env.Out, usage)
		return err
	}
	if _, op := operationTypes[cmd]; !op && !commands[cmd] {
		fs.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
	c, ns, err := env.Client(o.kubeconfig, o.context)
	if err != nil {
		return err
	}
	if o.namespace != "" {
		ns = o.namespace
	}
	return dispatch(context.Background(), c, env, o, ns, cmd, rest)
}

// dispatch runs one command against the API.
func dispatch(ctx context.Context, c client.Client, env Env, o options, ns, cmd string, rest []string) error {
	say := func(format string, a ...any) { _, _ = fmt.Fprintf(env.Out, format+"\n", a...) }
	name := func() (string, error) {
		if len(rest) == 0 {
			return "", fmt.Errorf("%s: the FaultTolerantVM's name is required", cmd)
		}
		return rest[0], nil
	}
	switch cmd {
	case "status":
		if len(rest) > 1 {
			return errors.New("status: one FaultTolerantVM's name, or none for all")
		}
		return status(ctx, c, env, ns, o.all, rest)
	case "console":
		n, err := name()
		if err != nil {
			return err
		}
		return console(ctx, c, env, o, ns, n)
	case "protection":
		if len(rest) != 2 {
			return errors.New("protection: want NAME enabled|suspended|disabled")
		}
		p, err := protectionOf(rest[1])
		if err != nil {
			return err
		}
		if err := setProtection(ctx, c, ns, rest[0], p); err != nil {
			return err
		}
		say("faulttolerantvm.ft.lockstep.dev/%s protection %s", rest[0], p)
		return nil
	case "adopt":
		if len(rest) != 1 {
			return errors.New("adopt: want the VirtualMachine's name")
		}
		return adopt(ctx, c, env, ns, rest[0], o.loggingNetwork, o.output, say)
	case "release":
		n, err := name()
		if err != nil {
			return err
		}
		return release(ctx, c, ns, n, o.wait, say)
	}
	typ := operationTypes[cmd]
	n, err := name()
	if err != nil {
		return err
	}
	if o.node != "" && typ != ftv1.OperationMigrateSecondary {
		return fmt.Errorf("%s takes no --node", cmd)
	}
	return runOperation(ctx, c, NewOperation(ns, n, typ, o.node), o.wait, say)
}

// parseInterspersed parses flags wherever they are among the words, as kubectl does.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return words, nil
		}
		words = append(words, args[0])
		args = args[1:]
	}
}

func status(ctx context.Context, c client.Client, env Env, ns string, all bool, names []string) error {
	now := env.Now()
	if len(names) == 1 {
		f := &ftv1.FaultTolerantVM{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: names[0]}, f); err != nil {
			return err
		}
		return Describe(env.Out, f, now)
	}
	var list ftv1.FaultTolerantVMList
	opts := []client.ListOption{}
	if !all {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return err
	}
	if len(list.Items) == 0 {
		where := "in namespace " + ns
		if all {
			where = "in any namespace"
		}
		_, err := fmt.Fprintln(env.Err, "No FaultTolerantVMs found", where+".")
		return err
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	rows := make([]Row, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, Summarize(&list.Items[i], now))
	}
	return PrintTable(env.Out, rows, all)
}

// console hands the terminal to virtctl's console of the member that runs the VM: the primary
// the status names (after a failover, the promoted secondary). kubectl's virt plugin serves
// where virtctl is not on the PATH.
func console(ctx context.Context, c client.Client, env Env, o options, ns, name string) error {
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, f); err != nil {
		return err
	}
	p := f.Status.Primary
	if p == nil || p.VMI == "" {
		return fmt.Errorf("FaultTolerantVM %s/%s has no primary (state %s)", ns, name, orDash(string(f.Status.State)))
	}
	for _, tool := range [][]string{{"virtctl"}, {"kubectl-virt"}} {
		path, err := exec.LookPath(tool[0])
		if err != nil {
			continue
		}
		_, _ = fmt.Fprintf(env.Err, "console of %s, the primary on node %s (%s)\n", p.VMI, p.Node, strings.Join(tool, " "))
		args := append(tool, "console", p.VMI, "--namespace", ns)
		if o.kubeconfig != "" {
			args = append(args, "--kubeconfig", o.kubeconfig)
		}
		if o.context != "" {
			args = append(args, "--context", o.context)
		}
		return env.Exec(path, args)
	}
	return fmt.Errorf("the console needs KubeVirt's virtctl (or kubectl's virt plugin) on the PATH: virtctl console %s --namespace %s", p.VMI, ns)
}

// kubeClient is the client of the kubeconfig kubectl would use, and its namespace.
func kubeClient(kubeconfig, context string) (client.Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	return c, ns, err
}
