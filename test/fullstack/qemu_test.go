//go:build fullstack

package fullstack

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/test/imagevolume"
	"github.com/lockstep-dev/lockstep/test/kubevirtdouble"
)

// qemuArchive is the OCI archive of lockstep's QEMU image that hack/local-cluster.sh writes for
// the cluster, from which the double pulls what launcher pods mount.
var qemuArchive = filepath.Join("..", "..", "bin", "local-cluster", clusterName, "lockstep-qemu.oci.tar")

// expectLockstepQEMU checks that member vmi runs lockstep's QEMU as a cluster delivers it: its
// launcher pod, as the API server admitted it, mounts the lockstep-qemu image read-only where
// the hook names the emulator, and its QEMU process runs that path, whose binary is the one in
// the image the pod names.
func expectLockstepQEMU(vmi string) {
	var pod corev1.Pod
	ExpectWithOffset(1, k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: kubevirtdouble.LauncherPodName(vmi)}, &pod)).To(Succeed())
	ref := ""
	for _, v := range pod.Spec.Volumes {
		if v.Name == "lockstep-qemu" && v.Image != nil {
			ref = v.Image.Reference
		}
	}
	ExpectWithOffset(1, ref).NotTo(BeEmpty(), "%s's launcher pod has no lockstep-qemu image volume: %+v", vmi, pod.Spec.Volumes)
	mounted := false
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			mounted = mounted || c.Name == "compute" && m.Name == "lockstep-qemu" && m.ReadOnly && m.MountPath == kubevirthook.LockstepQEMUMount
		}
	}
	ExpectWithOffset(1, mounted).To(BeTrue(), "%s's compute container does not mount lockstep-qemu read-only at %s", vmi, kubevirthook.LockstepQEMUMount)

	pid := strconv.Itoa(qemuPID(vmi))
	exe, err := os.Readlink(filepath.Join("/proc", pid, "exe"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, exe).To(Equal(kubevirthook.LockstepQEMU), "the QEMU that runs %s", vmi)

	reg := &imagevolume.Registry{Archives: []string{qemuArchive}, Dir: GinkgoT().TempDir()}
	image, _, err := reg.Pull(ref)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, fileSum(filepath.Join("/proc", pid, "exe"))).To(Equal(fileSum(filepath.Join(image, "bin", "qemu-system-x86_64"))),
		"%s's QEMU is not the binary of the image %s", vmi, ref)
}

func fileSum(path string) string {
	f, err := os.Open(path)
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	h := sha256.New()
	_, err = io.Copy(h, f)
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	return string(h.Sum(nil))
}
