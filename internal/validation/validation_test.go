package validation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	"k8s.io/utils/ptr"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/placement"
)

func valid() *ftv1.FaultTolerantVM {
	guest := resource.MustParse("1Gi")
	return &ftv1.FaultTolerantVM{
		ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: ftv1.FaultTolerantVMSpec{Template: ftv1.VMITemplate{Spec: virtv1.VirtualMachineInstanceSpec{
			Domain: virtv1.DomainSpec{Memory: &virtv1.Memory{Guest: &guest}},
			Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{
				PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}}},
		}}},
	}
}

func TestValidate(t *testing.T) {
	if errs := Validate(valid()); len(errs) != 0 {
		t.Fatalf("valid spec rejected: %v", errs)
	}
	cases := []struct {
		name   string
		mutate func(*ftv1.FaultTolerantVM)
		want   string // a part of the message, and the field
	}{
		{"long name", func(f *ftv1.FaultTolerantVM) { f.Name = strings.Repeat("a", 57) }, "metadata.name"},
		{"a key of lockstep's own in the template", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Metadata.Annotations = map[string]string{ftv1.AnnotationSyncedAt: "2026-11-26T10:00:00Z", "team": "db"}
		}, "spec.template.metadata.annotations[ft.lockstep.dev/synced-at]: Forbidden: keys under ft.lockstep.dev/ are lockstep's own"},
		{"a label of lockstep's own in the template", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Metadata.Labels = map[string]string{ftv1.LabelRole: ftv1.RolePrimary}
		}, "spec.template.metadata.labels[ft.lockstep.dev/role]"},
		{"no memory", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Domain.Memory = nil }, "the guest memory must be set"},
		{"gpu", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Domain.Devices.GPUs = []virtv1.GPU{{Name: "g"}} }, "GPUs cannot be fault tolerant"},
		{"host device", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.HostDevices = []virtv1.HostDevice{{Name: "h"}}
		}, "host devices cannot be fault tolerant"},
		{"virtiofs", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Filesystems = []virtv1.Filesystem{{Name: "fs"}}
		}, "virtiofs"},
		{"hostDisk", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{HostDisk: &virtv1.HostDisk{Path: "/d"}}
		}, "spec.template.spec.volumes[0].hostDisk"},
		{"hotplug dataVolume", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "dv", Hotpluggable: true}}
		}, "spec.template.spec.volumes[0].dataVolume.hotpluggable"},
		{"hotplug volume", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.Hotpluggable = true
		}, "hotplugged volumes"},
		{"sriov", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Interfaces = []virtv1.Interface{{Name: "x", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{SRIOV: &virtv1.InterfaceSRIOV{}}}}
		}, "SR-IOV"},
		{"reserved interface name", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Interfaces = []virtv1.Interface{{Name: "ft-logging"}}
		}, "reserved for the FT logging network"},
		{"reserved network name", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Networks = []virtv1.Network{{Name: "ft-logging"}}
		}, "spec.template.spec.networks[0].name"},
		{"guest NIC on the logging network", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Networks = []virtv1.Network{{Name: "net1", NetworkSource: virtv1.NetworkSource{Multus: &virtv1.MultusNetwork{NetworkName: f.Spec.LoggingNetwork.Name}}}}
		}, "not attached to the guest"},
		{"cpu hotplug", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Sockets: 1, MaxSockets: 4}
		}, "CPU hotplug"},
		{"memory hotplug", func(f *ftv1.FaultTolerantVM) {
			m := resource.MustParse("4Gi")
			f.Spec.Template.Spec.Domain.Memory.MaxGuest = &m
		}, "memory hotplug"},
		{"dotted name", func(f *ftv1.FaultTolerantVM) { f.Name = "a.b" }, "DNS labels"},
		{"memory request below the guest", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}
		}, "resources.requests.memory"},
		{"memory limit above the guest", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}
		}, "resources.limits.memory"},
		{"fractional CPU", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}
		}, "vCPU count (1)"},
		{"overcommitted overhead", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Domain.Resources.OvercommitGuestOverhead = true }, "overcommitGuestOverhead"},
		{"usb", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.ClientPassthrough = &virtv1.ClientPassthroughDevices{}
		}, "USB"},
		{"persistent tpm", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.TPM = &virtv1.TPMDevice{Persistent: ptr.To(true)}
		}, "tpm.persistent"},
		{"persistent efi", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Firmware = &virtv1.Firmware{Bootloader: &virtv1.Bootloader{EFI: &virtv1.EFI{Persistent: ptr.To(true)}}}
		}, "efi.persistent"},
		{"sev", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.Domain.LaunchSecurity = &virtv1.LaunchSecurity{} }, "launchSecurity"},
		{"downward metrics", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.DownwardMetrics = &virtv1.DownwardMetrics{}
		}, "downwardMetrics"},
		{"lun", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Disks = []virtv1.Disk{{Name: "root", DiskDevice: virtv1.DiskDevice{LUN: &virtv1.LunTarget{}}}}
		}, "disks[0].lun"},
		{"persistent reservation", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Disks = []virtv1.Disk{{Name: "root", DiskDevice: virtv1.DiskDevice{LUN: &virtv1.LunTarget{Reservation: true}}}}
		}, "lun.reservation"},
		{"shareable", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Disks = []virtv1.Disk{{Name: "root", Shareable: ptr.To(true)}}
		}, "shareable"},
		{"multiqueue", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(true)
		}, "networkInterfaceMultiqueue: Forbidden: COLO compares the packets of a NIC with one queue"},
		{"two NICs", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Interfaces = []virtv1.Interface{{Name: "a"}, {Name: "b"}}
		}, "interfaces: Forbidden: COLO compares the packets of one NIC; the template has 2"},
		{"bridge on the pod network", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Domain.Devices.Interfaces = []virtv1.Interface{{Name: "default", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}}}
			f.Spec.Template.Spec.Networks = []virtv1.Network{{Name: "default", NetworkSource: virtv1.NetworkSource{Pod: &virtv1.PodNetwork{}}}}
		}, "interfaces[0].bridge: Forbidden: bridge binding on the pod network"},
		{"config drive", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes = append(f.Spec.Template.Spec.Volumes, virtv1.Volume{Name: "ci", VolumeSource: virtv1.VolumeSource{CloudInitConfigDrive: &virtv1.CloudInitConfigDriveSource{UserData: "#cloud-config"}}})
		}, "volumes[1].cloudInitConfigDrive: Forbidden: a config drive's instance_id is the VMI's name"},
		{"liveness probe", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.LivenessProbe = &virtv1.Probe{} }, "livenessProbe: Forbidden"},
		{"readiness probe", func(f *ftv1.FaultTolerantVM) { f.Spec.Template.Spec.ReadinessProbe = &virtv1.Probe{} }, "readinessProbe: Forbidden"},
		{"logging config not JSON", func(f *ftv1.FaultTolerantVM) { f.Spec.LoggingNetwork.Config = "macvlan" }, "not a JSON object"},
		{"logging config without a type", func(f *ftv1.FaultTolerantVM) { f.Spec.LoggingNetwork.Config = `{"cniVersion":"1.0.0"}` }, `neither a "type"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := valid()
			c.mutate(f)
			errs := Validate(f)
			if len(errs) == 0 {
				t.Fatal("accepted")
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, c.want) {
				t.Fatalf("message %q does not contain %q", msg, c.want)
			}
		})
	}
}

func TestWhatCOLOCanCompareIsValid(t *testing.T) {
	f := valid()
	spec := &f.Spec.Template.Spec
	spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(false)
	spec.Domain.Devices.Interfaces = []virtv1.Interface{{Name: "vmnet", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}}}
	spec.Networks = []virtv1.Network{{Name: "vmnet", NetworkSource: virtv1.NetworkSource{Multus: &virtv1.MultusNetwork{NetworkName: "vm-net"}}}}
	if errs := Validate(f); len(errs) != 0 {
		t.Fatalf("one NIC bridged on a Multus network was refused: %v", errs)
	}
	spec.Domain.Devices.Interfaces[0].InterfaceBindingMethod = virtv1.InterfaceBindingMethod{Masquerade: &virtv1.InterfaceMasquerade{}}
	spec.Networks[0].NetworkSource = virtv1.NetworkSource{Pod: &virtv1.PodNetwork{}}
	if errs := Validate(f); len(errs) != 0 {
		t.Fatalf("masquerade on the pod network was refused: %v", errs)
	}
}

func TestFullReservationIsValid(t *testing.T) {
	f := valid()
	f.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 2}
	f.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1024Mi"), corev1.ResourceCPU: resource.MustParse("2")}
	f.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("2000m")}
	f.Spec.LoggingNetwork.Config = `{"cniVersion":"1.0.0","plugins":[{"type":"macvlan"}]}`
	if errs := Validate(f); len(errs) != 0 {
		t.Fatalf("a full reservation, written another way, was refused: %v", errs)
	}
}

func TestValidateUpdate(t *testing.T) {
	running := valid()
	running.Spec.RunStrategy, running.Spec.UpdatePolicy = ftv1.RunStrategyRunning, ftv1.UpdatePolicyRefuse
	changed := running.DeepCopy()
	changed.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 2}
	relabelled := running.DeepCopy()
	relabelled.Labels = map[string]string{"team": "mail"}
	halted := running.DeepCopy()
	halted.Spec.RunStrategy = ftv1.RunStrategyHalted
	haltedChanged := changed.DeepCopy()
	haltedChanged.Spec.RunStrategy = ftv1.RunStrategyHalted
	staged := running.DeepCopy()
	staged.Spec.UpdatePolicy = ftv1.UpdatePolicyStaged
	stagedChanged := changed.DeepCopy()
	stagedChanged.Spec.UpdatePolicy = ftv1.UpdatePolicyStaged
	for _, c := range []struct {
		name       string
		old, new   *ftv1.FaultTolerantVM
		wantRefuse bool
	}{
		{"template change while running", running, changed, true},
		{"template change and halt at once", running, haltedChanged, true},
		{"metadata change while running", running, relabelled, false},
		{"halt", running, halted, false},
		{"template change while halted", halted, haltedChanged, false},
		{"template change under Staged", staged, stagedChanged, false},
		{"policy relaxed to Staged with the change", running, stagedChanged, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if errs := ValidateUpdate(c.old, c.new); (len(errs) > 0) != c.wantRefuse {
				t.Fatalf("refused=%v, want %v: %v", len(errs) > 0, c.wantRefuse, errs)
			}
		})
	}
}

func TestValidateRoom(t *testing.T) {
	limits := placement.Limits{MaxMembers: 4, MaxVCPUs: 8, LogBandwidthMbps: 1000}
	node := func(name string, l placement.Limits, mem string) Room {
		r := Room{Name: name, Limits: l}
		if mem != "" {
			r.Memory = resource.MustParse(mem)
		}
		return r
	}
	wide := valid()
	wide.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 12}
	for _, c := range []struct {
		name      string
		ftvm      *ftv1.FaultTolerantVM
		bw        int
		nodes     []Room
		wantErr   string
		wantWarn  string
		wantClean bool
		ramCache  bool
	}{
		{name: "no nodes yet", ftvm: wide, bw: 100, wantWarn: "no nodes yet"},
		{name: "fits two", ftvm: valid(), bw: 100, nodes: []Room{node("a", limits, ""), node("b", limits, "")}, wantClean: true},
		{name: "above every vCPU limit", ftvm: wide, bw: 100, nodes: []Room{node("a", limits, ""), node("b", limits, "")},
			wantErr: "2 nodes where the FT vCPU limit is 8"},
		{name: "one node raised", ftvm: wide, bw: 100, nodes: []Room{node("a", placement.Limits{MaxMembers: 4, MaxVCPUs: 16}, ""), node("b", limits, "")},
			wantWarn: "only node a"},
		{name: "memory", ftvm: valid(), bw: 100, nodes: []Room{node("a", limits, "512Mi"), node("b", limits, "512Mi")},
			wantErr: "2 nodes where it has 512Mi of memory to allocate"},
		{name: "no FT slots", ftvm: valid(), bw: 100, nodes: []Room{node("a", placement.Limits{MaxVCPUs: 8}, "")},
			wantErr: "the FT VM limit is 0"},
		{name: "bandwidth", ftvm: valid(), bw: 2000, nodes: []Room{node("a", limits, ""), node("b", limits, "")},
			wantErr: "logging bandwidth budget is 1000 Mbit/s"},
		{name: "a COLO secondary's RAM cache", ftvm: valid(), bw: 100, nodes: []Room{node("a", limits, "1536Mi"), node("b", limits, "1536Mi")}, ramCache: true,
			wantErr: "no node can hold this VM's secondary: a COLO secondary reserves the guest's memory twice (2Gi"},
		{name: "room for the secondary on one node", ftvm: valid(), bw: 100, nodes: []Room{node("a", limits, "1536Mi"), node("b", limits, "4Gi")}, ramCache: true,
			wantClean: true},
		{name: "bandwidth not budgeted", ftvm: valid(), bw: 2000, nodes: []Room{node("a", placement.Limits{MaxMembers: 4, MaxVCPUs: 8}, ""), node("b", placement.Limits{MaxMembers: 4, MaxVCPUs: 8}, "")},
			wantClean: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs, warnings := ValidateRoom(c.ftvm, c.bw, c.nodes, c.ramCache)
			msg := errs.ToAggregate()
			switch {
			case c.wantClean:
				if len(errs) > 0 || len(warnings) > 0 {
					t.Fatalf("errors %v, warnings %v", errs, warnings)
				}
			case c.wantErr != "":
				if msg == nil || !strings.Contains(msg.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", msg, c.wantErr)
				}
			default:
				if len(errs) > 0 || len(warnings) != 1 || !strings.Contains(warnings[0], c.wantWarn) {
					t.Fatalf("errors %v, warnings %v, want the warning %q", errs, warnings, c.wantWarn)
				}
			}
		})
	}
}

func TestPodSecurityLevelsThatRefuseMembers(t *testing.T) {
	for labels, refused := range map[string]bool{"": false, "privileged": false, "baseline": true, "restricted": true} {
		l := map[string]string{}
		if labels != "" {
			l["pod-security.kubernetes.io/enforce"] = labels
		}
		if got := PodSecurityProblem(l) != ""; got != refused {
			t.Errorf("enforce %q: refused %v, want %v (%s)", labels, got, refused, PodSecurityProblem(l))
		}
	}
	if why := PodSecurityProblem(map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}); !strings.Contains(why, "pod-security.kubernetes.io/enforce=privileged") {
		t.Errorf("the error must say what to change: %s", why)
	}
}
