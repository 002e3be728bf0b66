package kubevirtdouble

import (
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// computeMounts is what the launcher pod's compute container mounts, as the kubelet gives it,
// with what the launcher image carries (virtlauncher.LauncherShares): path in the container ->
// directory on this machine. A hostPath of type Directory holds the launch until it exists on
// the node's host (lockstep's member directory, which lockstepd makes for QEMU's user), and is
// not mounted: the double's node paths are its hosts' directories (Host.OnHost), which the hook
// is given as they are. An image volume is pulled from Images and mounted read-only at its path
// (lockstep's QEMU, at virtlauncher.QEMUImageMount).
func (d *Domains) computeMounts(ho *Host, pod *corev1.Pod) (map[string]string, error) {
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := virtlauncher.LauncherShares(d.QEMU, d.Guest)
	for _, c := range pod.Spec.Containers {
		if c.Name != "compute" {
			continue
		}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			switch {
			case !ok:
				return nil, fmt.Errorf("the compute container mounts volume %q, which the pod does not have", m.Name)
			case v.HostPath != nil:
				dir, err := ho.OnHost(v.HostPath.Path)
				if err != nil {
					return nil, err
				}
				if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectory {
					if err := waitForDir(dir, 2*time.Minute); err != nil {
						return nil, err
					}
				}
			case v.Image != nil:
				if d.Images == nil {
					return nil, fmt.Errorf("the pod mounts image %s, and the double has no images", v.Image.Reference)
				}
				root, _, err := d.Images.Pull(v.Image.Reference)
				if err != nil {
					return nil, err
				}
				mounts[m.MountPath] = root
			}
		}
	}
	return mounts, nil
}

// waitForDir waits until dir exists, as the kubelet retries a hostPath of type Directory.
func waitForDir(dir string, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(200 * time.Millisecond) {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pod's hostPath %s is not there after %s (lockstepd on the node makes a member's directory)", dir, limit)
		}
	}
}
