package kubevirtdouble

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/lockstep-dev/lockstep/internal/colo"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/test/imagevolume"
	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// Domains is the local cluster's launcher mode: it boots each member VMI that the scheduler bound
// to a node on that node's host, as virt-launcher would with lockstep's hook (test/virtlauncher:
// the hook binary, a libvirt daemon of the VMI's own, real QEMU), with the Debian guest
// (hack/debian-guest.sh) booting from its disk. Launcher mirrors the domain's state into the VMI.
//
// What KubeVirt would take from the VMI, it takes from the VMI: the domain name, the firmware
// UUID, the NIC's MAC, the guest's memory and vCPUs, the disks in their order, the NoCloud ISO
// (written from the cloudInitNoCloud volume, as the launcher writes it), startStrategy Paused.
// What the kubelet would take from the launcher pod, it takes from the pod, as the API server
// admitted it (config/kubevirt's policies): the compute container's hostPath volumes, which hold
// the launch until they exist on the node, and its image volumes, pulled from Images and
// mounted where the pod says (lockstep's QEMU).
// A claim's disk is an image under Storage, kept across hosts, as network storage would keep it:
// a new claim of the user's that is the VMI's first claim starts as the guest's image, as a
// DataVolume imports one; any other starts blank, as a blank DataVolume or a new PVC does; each
// at the size CDI or KubeVirt gives it (images.go). Claims removes the image once its claim is
// deleted.
type Domains struct {
	Hosts *Hosts
	// QEMU and Guest are hack/qemu.sh's and hack/debian-guest.sh's directories (the launcher
	// image's OVMF, and the guest's image); Hook the hook binary.
	QEMU, Guest, Hook string
	// Images are what the launcher pods' image volumes name, as a registry serves them.
	Images *imagevolume.Registry
	// Storage holds the claims' images (<namespace>/<claim>.img).
	Storage string
	// Changed receives the VMIs whose domain changed state.
	Changed chan event.GenericEvent
	Log     logr.Logger

	mu    sync.Mutex
	byVMI map[types.NamespacedName]*domain
}

// DomainState is what Launcher mirrors into a VMI.
type DomainState string

const (
	// HostDown: the node's host is dead; nothing on it reports (the VMI is left as it is).
	HostDown DomainState = "HostDown"
	// HostCut: the node's host is cut from the API server: it neither reports nor launches.
	HostCut DomainState = "HostCut"
	// DomainStarting: being launched.
	DomainStarting DomainState = "Starting"
	// DomainRunning: QEMU runs (paused or not).
	DomainRunning DomainState = "Running"
	// DomainExited: QEMU is gone (it quit, was fenced or crashed), or the launch failed.
	DomainExited DomainState = "Exited"
)

// domain is one VMI's domain on a host.
type domain struct {
	key  types.NamespacedName
	uid  types.UID
	host *Host
	dir  string
	tap  string

	mu       sync.Mutex
	state    DomainState
	reason   string
	launched *virtlauncher.Launched
	gone     bool // destroyed or killed: the launch, if still going, undoes itself
	// destroyDeferred: deleted while its host was cut from the API server; destroyed once healed
	// (guarded by Domains.mu, as byVMI).
	destroyDeferred bool
}

// State is the domain of vmi on the node its launcher pod is bound to; a VMI that has none yet is
// launched there, from the pod.
func (d *Domains) State(vmi *virtv1.VirtualMachineInstance, pod *corev1.Pod) (DomainState, string) {
	ho := d.Hosts.Host(pod.Spec.NodeName)
	if ho == nil {
		return HostDown, "the node's host is down"
	}
	if ho.isCut() {
		return HostCut, "the node's host is cut from the API server"
	}
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
	d.mu.Lock()
	if d.byVMI == nil {
		d.byVMI = map[types.NamespacedName]*domain{}
	}
	dom := d.byVMI[key]
	if dom != nil && dom.uid == vmi.UID && dom.host != ho {
		// Its host died and came back empty: as virt-handler finds after a reboot, the domain
		// is gone.
		d.mu.Unlock()
		return DomainExited, "the domain went with its host"
	}
	if dom != nil && dom.uid != vmi.UID {
		// An earlier VMI of the same name.
		delete(d.byVMI, key)
		go dom.destroy()
		dom = nil
	}
	if dom == nil {
		dom = &domain{key: key, uid: vmi.UID, host: ho, state: DomainStarting, reason: "launching",
			dir: filepath.Join(ho.Dir, "m", string(vmi.UID)[:8]), tap: "t" + string(vmi.UID)[:8]}
		d.byVMI[key] = dom
		ho.mu.Lock()
		ho.domains[vmi.UID] = dom
		ho.mu.Unlock()
		go d.launch(dom, vmi.DeepCopy(), pod.DeepCopy())
	}
	d.mu.Unlock()
	dom.mu.Lock()
	defer dom.mu.Unlock()
	return dom.state, dom.reason
}

// Destroy is virt-launcher's answer to the VMI's deletion: libvirt destroys the domain.
func (d *Domains) Destroy(key types.NamespacedName) {
	d.mu.Lock()
	dom := d.byVMI[key]
	if dom != nil && !dom.destroyDeferred && dom.host.whenHealed(func() { d.Destroy(key) }) {
		// Its kubelet, cut from the API server, does not see the deletion: the domain runs on.
		dom.destroyDeferred = true
		d.mu.Unlock()
		d.Log.Info("domain's deletion not seen: its host is cut from the API server", "vmi", key, "node", dom.host.Node)
		return
	}
	if dom != nil && dom.destroyDeferred && dom.host.isCut() {
		d.mu.Unlock()
		return
	}
	delete(d.byVMI, key)
	d.mu.Unlock()
	if dom != nil {
		dom.host.mu.Lock()
		delete(dom.host.domains, dom.uid)
		dom.host.mu.Unlock()
		dom.destroy()
		d.Log.Info("domain destroyed", "vmi", key, "node", dom.host.Node)
	}
}

// Console is the console file of vmi's domain ("" if it has none here).
func (d *Domains) Console(key types.NamespacedName) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dom := d.byVMI[key]; dom != nil {
		return filepath.Join(dom.dir, "console")
	}
	return ""
}

func (d *Domains) launch(dom *domain, vmi *virtv1.VirtualMachineInstance, pod *corev1.Pod) {
	l, err := d.start(dom, vmi, pod)
	dom.mu.Lock()
	switch {
	case err != nil:
		dom.state, dom.reason = DomainExited, "launch failed: "+err.Error()
		d.Log.Error(err, "launch failed", "vmi", dom.key, "node", dom.host.Node)
	case dom.gone:
		// Destroyed or killed while it launched.
		dom.mu.Unlock()
		l.Kill()
		return
	default:
		dom.launched, dom.state, dom.reason = l, DomainRunning, ""
		d.Log.Info("domain running", "vmi", dom.key, "node", dom.host.Node, "pid", l.PID)
		go func() {
			<-l.Exited
			// The launcher ends with its QEMU, as KubeVirt's pod does: its daemon and hook, and
			// its memory cgroup. A QEMU that the kernel killed at the launcher's limit is
			// reported as KubeVirt's pod would be: OOMKilled.
			reason := "QEMU exited"
			if l.Cgroup != nil {
				if n, err := l.Cgroup.OOMKills(); err == nil && n > 0 {
					reason = "QEMU exited: OOMKilled (over the launcher's memory limit)"
				}
			}
			l.Stop()
			l.RemoveCgroup()
			dom.mu.Lock()
			dom.state, dom.reason = DomainExited, reason
			dom.mu.Unlock()
			d.Log.Info("domain's QEMU exited", "vmi", dom.key, "node", dom.host.Node, "reason", reason)
			d.changed(vmi)
		}()
	}
	dom.mu.Unlock()
	d.changed(vmi)
}

func (d *Domains) changed(vmi *virtv1.VirtualMachineInstance) {
	if d.Changed != nil {
		d.Changed <- event.GenericEvent{Object: vmi}
	}
}

// start launches vmi's domain on its host, as its launcher pod says.
func (d *Domains) start(dom *domain, vmi *virtv1.VirtualMachineInstance, pod *corev1.Pod) (*virtlauncher.Launched, error) {
	if len(vmi.Spec.Domain.Devices.Interfaces) == 0 || vmi.Spec.Domain.Devices.Interfaces[0].MacAddress == "" {
		return nil, errors.New("the VMI has no interface with a MAC address")
	}
	memoryMB := 256
	if m := vmi.Spec.Domain.Memory; m != nil && m.Guest != nil {
		memoryMB = int(m.Guest.Value() >> 20)
	}
	// The launcher pod's own files (its emptyDirs), which QEMU's user writes.
	if err := os.MkdirAll(dom.dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(dom.dir, virtlauncher.QEMUUser.UID, virtlauncher.QEMUUser.GID); err != nil {
		return nil, err
	}
	mounts, err := d.computeMounts(dom.host, pod)
	if err != nil {
		return nil, err
	}
	disks, err := d.disks(dom, vmi)
	if err != nil {
		return nil, err
	}
	ns := dom.host.NS
	if err := ipAll([][]string{{"-n", ns, "tuntap", "add", dom.tap, "mode", "tap"},
		{"-n", ns, "link", "set", dom.tap, "master", "br0"}, {"-n", ns, "link", "set", dom.tap, "up"}}); err != nil {
		return nil, err
	}
	uuid := ""
	if fw := vmi.Spec.Domain.Firmware; fw != nil {
		uuid = string(fw.UUID)
	}
	vm := colo.VM{
		MemoryMB: memoryMB, Tap: dom.tap, MAC: vmi.Spec.Domain.Devices.Interfaces[0].MacAddress,
		QMP: filepath.Join(dom.dir, "launcher.qmp"), Serial: filepath.Join(dom.dir, "console"),
	}
	return virtlauncher.Launch(context.Background(), virtlauncher.Member{
		VMI: vmi, Sizing: Sizing(context.Background(), d.Hosts),
		Domain: virtlauncher.DomainSpec{Name: vmi.Namespace + "_" + vmi.Name, UUID: uuid, VMIUID: string(vmi.UID),
			VM: vm, VCPUs: member.VCPUs(&vmi.Spec),
			Interface: vmi.Spec.Domain.Devices.Interfaces[0].Name, Disks: disks, EFI: efi(vmi)},
		NetNS: ns, StateDir: dom.dir, HookBin: d.Hook, RunDir: dom.host.RunDir, Log: dom.dir,
		Paused: vmi.Spec.StartStrategy != nil && *vmi.Spec.StartStrategy == virtv1.StartStrategyPaused,
		Shares: mounts,
	})
}

// disks are the VMI's disks in its order, each with its image on this host, as virt-launcher
// has them: a claim's image is raw, on Storage, kept across hosts (as network storage keeps a
// volume), and made as CDI or KubeVirt would when the claim has none (claimImage); an emptyDisk
// is a qcow2 image that the launcher makes (the COLO overlays); a cloudInitNoCloud volume is the
// ISO the launcher writes from it.
func (d *Domains) disks(dom *domain, vmi *virtv1.VirtualMachineInstance) ([]virtlauncher.Disk, error) {
	volumes := map[string]virtv1.Volume{}
	for _, v := range vmi.Spec.Volumes {
		volumes[v.Name] = v
	}
	var disks []virtlauncher.Disk
	claims := 0
	for _, disk := range vmi.Spec.Domain.Devices.Disks {
		v, ok := volumes[disk.Name]
		if !ok {
			return nil, fmt.Errorf("disk %s has no volume", disk.Name)
		}
		var dd virtlauncher.Disk
		switch claim := member.ClaimOf(&v); {
		case claim != "": // a persistentVolumeClaim, or a dataVolume's claim
			dd = virtlauncher.Disk{Name: disk.Name, Kind: virtlauncher.Claim, File: ClaimImage(d.Storage, vmi.Namespace, claim)}
			claims++
			if _, err := os.Stat(dd.File); err == nil {
				break // the claim keeps its data
			}
			if err := d.claimImage(context.Background(), vmi.Namespace, claim, dd.File, claims == 1); err != nil {
				return nil, err
			}
		case v.EmptyDisk != nil:
			dd = virtlauncher.Disk{Name: disk.Name, Kind: virtlauncher.EmptyDisk, File: filepath.Join(dom.dir, disk.Name+".qcow2")}
			if err := d.emptyDiskImage(v.EmptyDisk, dd.File); err != nil {
				return nil, err
			}
		case v.CloudInitNoCloud != nil:
			dd = virtlauncher.Disk{Name: disk.Name, Kind: virtlauncher.NoCloud, File: filepath.Join(dom.dir, "noCloud.iso")}
			if err := virtlauncher.NoCloudISO(vmi, v.Name, dd.File); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("disk %s: the double launches claims (persistentVolumeClaim, dataVolume), emptyDisks and cloudInitNoCloud volumes", disk.Name)
		}
		dd.Serial = disk.Serial
		disks = append(disks, dd)
	}
	return disks, nil
}

// destroy ends the domain through libvirt, and removes its tap.
func (dom *domain) destroy() {
	dom.end((*virtlauncher.Launched).Destroy)
	_ = exec.Command("ip", "-n", dom.host.NS, "link", "delete", dom.tap).Run()
}

// kill is the host dying under the domain.
func (dom *domain) kill() { dom.end((*virtlauncher.Launched).Kill) }

// end marks the domain gone (a launch still under way undoes itself) and ends what runs by how.
func (dom *domain) end(how func(*virtlauncher.Launched)) {
	dom.mu.Lock()
	dom.gone = true
	l := dom.launched
	dom.mu.Unlock()
	if l != nil {
		how(l)
	}
}

// efi says whether the VMI boots with EFI (OVMF), not SeaBIOS.
func efi(vmi *virtv1.VirtualMachineInstance) bool {
	fw := vmi.Spec.Domain.Firmware
	return fw != nil && fw.Bootloader != nil && fw.Bootloader.EFI != nil
}
