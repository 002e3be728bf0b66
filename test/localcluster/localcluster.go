// Package localcluster drives one local cluster of hack/local-cluster.sh for the suites and
// benchmarks that run on it (e2e, full stack, chaos): bring it up from a clean slate, run its
// commands, reach its API server and kubectl, tail its logs when a spec fails, and take it down
// unless a person asked to keep it.
package localcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockstep-dev/lockstep/controllers"
)

// Cluster is one named local cluster.
type Cluster struct {
	// Name is its CLUSTER_NAME.
	Name string
	// Root is the repository's root.
	Root string
	// KeepEnv names the environment variable that, when set, leaves the cluster up at the end.
	KeepEnv string
	env     []string
}

// New is the cluster called name, with hack/local-cluster.sh's settings env ("FULL_STACK=1").
func New(name, keepEnv string, env ...string) *Cluster {
	_, file, _, _ := runtime.Caller(0)
	return &Cluster{
		Name:    name,
		Root:    filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..")),
		KeepEnv: keepEnv,
		env:     append([]string{"CLUSTER_NAME=" + name}, env...),
	}
}

// Run runs hack/local-cluster.sh with args and returns its output.
func (c *Cluster) Run(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.Root, "hack", "local-cluster.sh"), args...)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("hack/local-cluster.sh %s: %w:\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Up brings the cluster up with n nodes, after taking down what an interrupted run left.
func (c *Cluster) Up(n int) error {
	if _, err := c.Run("down"); err != nil {
		return err
	}
	_, err := c.Run("up", fmt.Sprint(n))
	return err
}

// End takes the cluster down, unless KeepEnv is set: then it says how to reach it.
func (c *Cluster) End() (string, error) {
	if c.KeepEnv != "" && os.Getenv(c.KeepEnv) != "" {
		kc, err := c.Kubeconfig()
		return fmt.Sprintf("%s set: the cluster %s stays up; KUBECONFIG=%s", c.KeepEnv, c.Name, kc), err
	}
	_, err := c.Run("down")
	return "", err
}

// Kubeconfig is the path of the cluster's kubeconfig.
func (c *Cluster) Kubeconfig() (string, error) {
	out, err := c.Run("kubeconfig")
	return strings.TrimSpace(out), err
}

// Client is a client of the cluster's API server with lockstep's scheme, which can also watch; qps
// and burst of 0 keep client-go's defaults.
func (c *Cluster) Client(qps float32, burst int) (client.WithWatch, error) {
	kc, err := c.Kubeconfig()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return nil, err
	}
	if qps > 0 {
		cfg.QPS, cfg.Burst = qps, burst
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: controllers.NewScheme()})
}

// Kubectl runs the cluster's kubectl (bin/k8s/kubectl) with args.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	kc, err := c.Kubeconfig()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(c.Root, "bin", "k8s", "kubectl"), append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w:\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// controlPlane are kwokctl's processes, which nothing starts again once they exit.
var controlPlane = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller"}

// Logs are the tails of the operator's, the double's and the kube-controller-manager's logs and
// of files, by file name, and which of the control plane's processes run ("control plane"): what
// a person needs first when a spec fails.
func (c *Cluster) Logs(lines int, files ...string) map[string]string {
	for _, p := range []string{"operator", "kubevirt-double", "kube-controller-manager"} {
		if out, err := c.Run("logs", p); err == nil {
			files = append([]string{strings.TrimSpace(out)}, files...)
		}
	}
	tails := map[string]string{"control plane": c.controlPlaneState()}
	for _, p := range files {
		out, _ := exec.Command("tail", "-n", fmt.Sprint(lines), p).CombinedOutput()
		tails[filepath.Base(p)] = string(out)
	}
	return tails
}

// controlPlaneState says, for each of the control plane's processes, whether it runs.
func (c *Cluster) controlPlaneState() string {
	var states []string
	for _, p := range controlPlane {
		state := "not running"
		if pid, err := c.PID(p); err == nil && syscall.Kill(pid, 0) == nil {
			state = "running"
		}
		states = append(states, p+": "+state)
	}
	return strings.Join(states, ", ")
}

// LoggingNetwork is the logging network that the suites' FaultTolerantVMs name ("ft-logging"),
// for namespace. The kwok nodes attach nothing: its CNI configuration need only be valid.
func LoggingNetwork(namespace string) *nadv1.NetworkAttachmentDefinition {
	return &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "ft-logging", Namespace: namespace},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.3.1","type":"macvlan","master":"eth1"}`},
	}
}

// PID is the pid of one of the cluster's processes: operator, kubevirt-double, or a component of
// kwokctl's (kube-apiserver, etcd, ...).
func (c *Cluster) PID(process string) (int, error) {
	out, err := c.Run("pid", process)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(out))
}

// HostsDir is where the full stack keeps the cluster's hosts (hack/local-cluster.sh's HOSTS_DIR).
func (c *Cluster) HostsDir() string { return "/run/lockstep-hosts/" + c.Name }

// Figures collects what a suite measures, to report and not to assert.
type Figures struct {
	// Title heads the list when it is printed.
	Title string
	// OnAdd, when set, sees each figure as it is added (a suite's report entry).
	OnAdd   func(what string, d time.Duration)
	mu      sync.Mutex
	entries []string
}

// Add records a figure.
func (f *Figures) Add(what string, d time.Duration) {
	f.mu.Lock()
	f.entries = append(f.entries, fmt.Sprintf("%-72s %8s", what, d.Round(time.Millisecond)))
	f.mu.Unlock()
	if f.OnAdd != nil {
		f.OnAdd(what, d)
	}
}

// AddText records a figure that is not a duration (a count, a rate, a size).
func (f *Figures) AddText(what, text string) {
	f.mu.Lock()
	f.entries = append(f.entries, fmt.Sprintf("%-72s %s", what, text))
	f.mu.Unlock()
}

// String is the figures under their title, sorted by what they measure.
func (f *Figures) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	sorted := append([]string(nil), f.entries...)
	sort.Strings(sorted)
	return "\n" + f.Title + ":\n  " + strings.Join(sorted, "\n  ") + "\n"
}
