package kubevirt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/member"
	"github.com/lockstep-dev/lockstep/test/virtlauncher"
)

// The reference domains (internal/domainhook/testdata/kubevirt-v1.9), which the hook's unit tests
// rewrite and the KubeVirt double's launcher generates, were written from a reading of KubeVirt's
// converter. Here KubeVirt's own converter writes them: the member VMI that each describes, built
// by member.Build and admitted by virt-api (a dry run: its mutator's defaults, nothing stored), goes
// through Convert_v1_VirtualMachineInstance_To_api_Domain and KubeVirt's domain defaulter
// (hack/kubevirt/domainxml, as virt-launcher's SyncVMI calls them), and the result must be the
// reference, element for element. Only the identifiers of this run are put back to the
// reference's: the VMI's UID, which the API server assigns.

func TestKubeVirtsConverterDefinesTheReferenceDomains(t *testing.T) {
	for _, c := range []struct {
		reference string
		efi       bool
	}{{"q35-seabios.xml", false}, {"q35-ovmf.xml", true}} {
		t.Run(c.reference, func(t *testing.T) {
			vmi := referenceMember(t, c.efi)
			got := kubevirtDomain(t, vmi)
			raw, err := os.ReadFile(filepath.Join(root, "internal", "domainhook", "testdata", "kubevirt-v1.9", c.reference))
			if err != nil {
				t.Fatal(err)
			}
			const refUID = "0c4e2f1a-7b3d-4e5f-9a1b-2c3d4e5f6a7b" // the reference VMI's UID
			got = strings.ReplaceAll(got, string(vmi.UID), refUID)
			var gotDom, refDom libvirtxml.Domain
			if err := gotDom.Unmarshal(got); err != nil {
				t.Fatalf("KubeVirt's domain: %v\n%s", err, got)
			}
			if err := refDom.Unmarshal(string(raw)); err != nil {
				t.Fatal(err)
			}
			// KubeVirt's metadata is opaque XML to libvirtxml: compared without its indentation.
			bare := func(d *libvirtxml.Domain) string { return strings.Join(strings.Fields(d.Metadata.XML), "") }
			if bare(&gotDom) != bare(&refDom) {
				t.Errorf("metadata:\n%s\n--- the reference's:\n%s", gotDom.Metadata.XML, refDom.Metadata.XML)
			}
			gotDom.Metadata, refDom.Metadata = nil, nil
			want, err := refDom.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			have, err := gotDom.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if have != want {
				t.Errorf("KubeVirt's converter defines another domain than the reference:\n%s\n--- the reference:\n%s", have, want)
			}
		})
	}
}

// referenceMember is the member VMI the reference domains describe (their header comment): demo/
// counter-1, the primary of the FaultTolerantVM counter, as member.Build makes it under COLO and
// virt-api's mutator defaults it (a dry-run create: stored nowhere).
func referenceMember(t *testing.T, efi bool) *virtv1.VirtualMachineInstance {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	guest := resource.MustParse("1Gi")
	disk := func(name string) virtv1.Disk {
		return virtv1.Disk{Name: name, DiskDevice: virtv1.DiskDevice{Disk: &virtv1.DiskTarget{Bus: virtv1.DiskBusVirtio}}}
	}
	claim := func(name, claim string) virtv1.Volume {
		return virtv1.Volume{Name: name, VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	spec := virtv1.VirtualMachineInstanceSpec{
		Domain: virtv1.DomainSpec{
			CPU: &virtv1.CPU{Cores: 2}, Memory: &virtv1.Memory{Guest: &guest},
			Devices: virtv1.Devices{
				Disks:      []virtv1.Disk{disk("rootdisk"), disk("datadisk"), disk("cloudinit")},
				Interfaces: []virtv1.Interface{{Name: "vmnet", MacAddress: "02:6c:73:00:00:01", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}}},
			},
		},
		Networks: []virtv1.Network{{Name: "vmnet", NetworkSource: virtv1.NetworkSource{Multus: &virtv1.MultusNetwork{NetworkName: "vmnet", Default: true}}}},
		Volumes: []virtv1.Volume{claim("rootdisk", "counter-root"), claim("datadisk", "counter-data"),
			{Name: "cloudinit", VolumeSource: virtv1.VolumeSource{CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{UserData: "#cloud-config\n"}}}},
	}
	if efi {
		spec.Domain.Firmware = &virtv1.Firmware{Bootloader: &virtv1.Bootloader{EFI: &virtv1.EFI{SecureBoot: new(false)}}}
	}
	ftvm := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "counter", UID: "6d1a7f0e-2c84-5b43-9a6e-3f2b1c0d9e8a"},
		Spec: ftv1.FaultTolerantVMSpec{Template: ftv1.VMITemplate{Spec: spec}}}
	vmi, err := member.Build(ftvm, member.Normalize(ftvm.UID, ftvm.Spec.Template), member.Member{Ordinal: 1, Role: ftv1.RolePrimary, Node: "node-1",
		Claims:    map[string]string{"rootdisk": "counter-root", "datadisk": "counter-data"},
		DiskSizes: map[string]resource.Quantity{"rootdisk": resource.MustParse("1Gi"), "datadisk": resource.MustParse("1Gi")},
		Since:     time.Now()}, member.Options{COLO: chartCOLO})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, vmi, client.DryRunAll); err != nil {
		t.Fatalf("virt-api's admission of the reference member: %v", err)
	}
	return vmi
}

// kubevirtDomain is the domain XML KubeVirt's converter makes of vmi (hack/kubevirt/domainxml,
// with args).
func kubevirtDomain(t *testing.T, vmi *virtv1.VirtualMachineInstance, args ...string) string {
	t.Helper()
	out, err := kubevirtDomainErr(t, vmi, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubevirtDomainErr is kubevirtDomain, its failure returned with what domainxml said.
func kubevirtDomainErr(t *testing.T, vmi *virtv1.VirtualMachineInstance, args ...string) (string, error) {
	t.Helper()
	in, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "bin", "kubevirt", "domainxml"), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("domainxml: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// TestTheDoubleCountsPCIDevicesAsKubeVirt: the KubeVirt double's launcher calls the hook as
// often as KubeVirt's define sequence does only if it counts the domain's PCI devices as KubeVirt
// does (they size the root ports KubeVirt adds for hot-plug, and whether it calls the hook a third
// time): KubeVirt's count (converter.CountPCIDevices) and the double's, of the domains KubeVirt's
// converter makes of the reference member (SeaBIOS and OVMF) and of a plain VM.
func TestTheDoubleCountsPCIDevicesAsKubeVirt(t *testing.T) {
	plain := vmiOf(t, plainVMI(t, "pci-plain", "1Gi", 0))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), plain) })
	for name, vmi := range map[string]*virtv1.VirtualMachineInstance{
		"member": referenceMember(t, false), "member-efi": referenceMember(t, true), "plain": plain,
	} {
		var d libvirtxml.Domain
		if err := d.Unmarshal(kubevirtDomain(t, vmi)); err != nil {
			t.Fatal(err)
		}
		want, err := strconv.Atoi(strings.TrimSpace(kubevirtDomain(t, vmi, "--pci-devices")))
		if err != nil {
			t.Fatal(err)
		}
		if got := virtlauncher.PCIDevices(&d); got != want {
			t.Errorf("%s: the double counts %d PCI devices, KubeVirt %d", name, got, want)
		}
		t.Logf("%s: %d PCI devices; the hook is called %d times", name, want, virtlauncher.Calls(&d))
	}
}

// TestLockstepsPluginCallsTheHookForMembersOnly: with lockstep's Plugin registered
// (config/kubevirt-plugin), KubeVirt's launcher code (plugins.ApplyDomainHooks, as virt-launcher
// calls it at boot) skips the hook for a plain VM, whose domain is left as it was, and calls it
// for a member, which fails here (no hook sidecar serves its socket) and, by the Plugin's failure
// strategy, does not start as a plain VM. The same Plugin without its condition stops the plain
// VM too: the condition is what keeps lockstep from every other VM of the cluster.
func TestLockstepsPluginCallsTheHookForMembersOnly(t *testing.T) {
	objs, err := readObjects(filepath.Join(root, "config", "kubevirt-plugin", "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var plugin map[string]any
	for _, u := range objs {
		if u.GetKind() == "Plugin" {
			plugin = u.Object
		}
	}
	if plugin == nil {
		t.Fatal("config/kubevirt-plugin/plugin.yaml has no Plugin")
	}
	withCondition := pluginsFile(t, plugin)
	unconditional := maps.Clone(plugin)
	spec := maps.Clone(plugin["spec"].(map[string]any))
	delete(spec, "condition")
	unconditional["spec"] = spec
	withoutCondition := pluginsFile(t, unconditional)

	plain := plainVMI(t, "plugin-plain", "1Gi", 0)
	admitted := vmiOf(t, plain)
	// (Compared as libvirt reads them: the Plugins' pass adds the qemu XML namespace.)
	if got, want := canonicalDomain(t, kubevirtDomain(t, admitted, "--plugins", withCondition)), canonicalDomain(t, kubevirtDomain(t, admitted)); got != want {
		t.Errorf("lockstep's Plugin changed a plain VM's domain:\n%s\n--- without it:\n%s", got, want)
	}
	// Both wait for the hook's socket as long as virt-launcher does (30 s): side by side.
	m := referenceMember(t, false)
	var errPlain, errMember error
	var wg sync.WaitGroup
	wg.Go(func() { _, errPlain = kubevirtDomainErr(t, admitted, "--plugins", withoutCondition) })
	wg.Go(func() { _, errMember = kubevirtDomainErr(t, m, "--plugins", withCondition) })
	wg.Wait()
	if errPlain == nil || !strings.Contains(errPlain.Error(), "plugin lockstep") {
		t.Errorf("lockstep's Plugin without its condition on a plain VM: %v; want the hook called and the VM failing", errPlain)
	}
	if errMember == nil || !strings.Contains(errMember.Error(), "plugin lockstep") {
		t.Errorf("a member with lockstep's Plugin and no hook sidecar: %v; want the hook called and the member failing", errMember)
	}
}

// pluginsFile writes plugins as the JSON list domainxml's --plugins reads.
func pluginsFile(t *testing.T, plugins ...map[string]any) string {
	t.Helper()
	data, err := json.Marshal(plugins)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "plugins.json")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// canonicalDomain is domain XML as libvirtxml reads and writes it.
func canonicalDomain(t *testing.T, xml string) string {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(xml); err != nil {
		t.Fatal(err)
	}
	out, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return out
}
