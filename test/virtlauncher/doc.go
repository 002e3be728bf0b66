// Package virtlauncher is a TEST DOUBLE of the part of KubeVirt's virt-launcher that starts a
// VMI's domain: it builds the domain in KubeVirt's shape, sends it through the VMI's hook sidecar
// (the built cmd/lockstep-kubevirt-hook, over its socket and gRPC, after the Info handshake), and
// defines and starts the result in a libvirt daemon of the VMI's own (Debian's libvirtd,
// hack/libvirt.sh), as each virt-launcher pod runs its own. KubeVirt's real launcher cannot run
// here (it needs its pod, virt-handler and KVM); the libvirt daemon, the hook and QEMU are real.
//
// The VM tier's libvirt stack (test/vmtier) and the local cluster's launcher mode
// (test/kubevirtdouble) both launch members with it.
package virtlauncher
