package validation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
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
		{"dataVolume", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "dv"}}
		}, "dataVolume volumes are not supported yet"},
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
