// Command kubevirtstrategy writes KubeVirt's install strategy, every object that virt-operator
// installs (CRDs, RBAC, webhooks, APIServices, the Deployments of virt-api and virt-controller,
// virt-handler's DaemonSet, ...), as virt-operator itself generates it: it starts the pinned
// kube-apiserver (make envtest-assets), runs virt-operator --dump-install-strategy against it, as
// the install-strategy Job that virt-operator starts in a cluster does, and decodes the ConfigMap
// that it writes.
//
//	go run ./hack/kubevirtstrategy -virt-operator bin/kubevirt/virt-operator -out bin/kubevirt/install-strategy.yaml
//
// hack/build-kubevirt.sh builds virt-operator.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// What virt-operator's install-strategy ConfigMap carries (KubeVirt v1.9.0's
// pkg/virt-operator/resource/generate/install): its label, and the manifests' encoding.
const (
	strategyLabel    = "kubevirt.io/install-strategy"
	encodingKey      = "kubevirt.io/install-strategy-cm-encoding"
	encodingGzipB64  = "gzip+base64"
	manifestsDataKey = "manifests"
)

func main() {
	operator := flag.String("virt-operator", "bin/kubevirt/virt-operator", "virt-operator's binary")
	version := flag.String("version", "v1.9.0", "the KubeVirt version the strategy is for (its images' tag)")
	registry := flag.String("registry", "quay.io/kubevirt", "the registry its images are named in")
	namespace := flag.String("namespace", "kubevirt", "the namespace KubeVirt installs into")
	out := flag.String("out", "bin/kubevirt/install-strategy.yaml", "the file to write")
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(*root, *operator, *version, *registry, *namespace, *out); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirtstrategy:", err)
		os.Exit(1)
	}
}

func run(root, operator, version, registry, namespace, out string) error {
	env := &envtest.Environment{BinaryAssetsDirectory: filepath.Join(root, "bin", "k8s")}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	defer func() { _ = env.Stop() }()
	user, err := env.AddUser(envtest.User{Name: "virt-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kubevirtstrategy")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	// The install-strategy Job's environment: the deployment config virt-operator computes from
	// the KubeVirt CR (util.KubeVirtDeploymentConfig), for a CR that leaves everything default.
	target, err := json.Marshal(map[string]string{"id": "lockstep", "namespace": namespace, "registry": registry, "kubeVirtVersion": version})
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, operator, "--dump-install-strategy", "--kubeconfig", kcPath)
	cmd.Env = append(os.Environ(),
		"VIRT_OPERATOR_IMAGE="+registry+"/virt-operator:"+version,
		"KUBEVIRT_VERSION="+version,
		"TARGET_DEPLOYMENT_CONFIG="+string(target))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s --dump-install-strategy: %w\n%s", operator, err, stderr.String())
	}

	cms, err := cs.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: strategyLabel})
	if err != nil {
		return err
	}
	if len(cms.Items) != 1 {
		return fmt.Errorf("virt-operator wrote %d install-strategy ConfigMaps, want one\n%s", len(cms.Items), stderr.String())
	}
	manifests, err := decode(cms.Items[0])
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	header := fmt.Sprintf("# KubeVirt %s's install strategy, as virt-operator --dump-install-strategy generates it\n# (hack/kubevirtstrategy; images in %s, namespace %s).\n", version, registry, namespace)
	return os.WriteFile(out, append([]byte(header), manifests...), 0o644)
}

// decode reads the manifests out of the install-strategy ConfigMap.
func decode(cm corev1.ConfigMap) ([]byte, error) {
	data, ok := cm.Data[manifestsDataKey]
	if !ok {
		return nil, errors.New("the install-strategy ConfigMap has no manifests")
	}
	if cm.Annotations[encodingKey] != encodingGzipB64 {
		return []byte(data), nil
	}
	gz, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, err
	}
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}
