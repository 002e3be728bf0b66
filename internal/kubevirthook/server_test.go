package kubevirthook_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	virtv1 "kubevirt.io/api/core/v1"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/info"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/plugins"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/v1alpha3"
)

func vmiJSON(t *testing.T, role string) []byte {
	t.Helper()
	vmi := virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm-1", UID: "0c4e2f1a", Labels: map[string]string{ftv1.LabelPair: "vm"}},
		Spec: virtv1.VirtualMachineInstanceSpec{
			Domain: virtv1.DomainSpec{Devices: virtv1.Devices{Disks: []virtv1.Disk{
				{Name: "cloudinitdisk", DiskDevice: virtv1.DiskDevice{CDRom: &virtv1.CDRomTarget{}}},
				{Name: "rootdisk"}, {Name: "datadisk"}, {Name: ftv1.DiskColoActive}, {Name: ftv1.DiskColoHidden}, {Name: "colo-active-1"}, {Name: "colo-hidden-1"},
			}}},
			// No replicated-disk annotation: the hook picks the disks as the operator would.
			Volumes: []virtv1.Volume{
				{Name: "cloudinitdisk", VolumeSource: virtv1.VolumeSource{CloudInitNoCloud: &virtv1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
				{Name: "rootdisk", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "vm-1-root"}}}},
				{Name: "datadisk", VolumeSource: virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "vm-1-data"}}}},
				{Name: ftv1.DiskColoActive, VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{}}},
				{Name: ftv1.DiskColoHidden, VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{}}},
				{Name: "colo-active-1", VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{}}},
				{Name: "colo-hidden-1", VolumeSource: virtv1.VolumeSource{EmptyDisk: &virtv1.EmptyDiskSource{}}},
			},
		},
	}
	if role != "" {
		vmi.Labels[ftv1.LabelRole] = role
	}
	if role == ftv1.RoleSecondary {
		vmi.Annotations = map[string]string{ftv1.AnnotationDiskBytes: "rootdisk=3191865344,datadisk=2147483648"}
	}
	b, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dial connects as virt-launcher does: insecure gRPC over the Unix socket.
func dial(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestBothKubeVirtInterfaces serves the hook on its two sockets and calls it as virt-launcher
// would: the sidecar's handshake and OnDefineDomain, and the plugin's MutateDomain at boot and
// on a migration target.
func TestBothKubeVirtInterfaces(t *testing.T) {
	dir := t.TempDir()
	sidecar, plugin := filepath.Join(dir, "hooks", "lockstep.sock"), filepath.Join(dir, "plugin", "hook.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kubevirthook.Serve(ctx, &kubevirthook.Hook{RunDir: "/var/run/lockstep"}, sidecar, plugin)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for _, s := range []string{sidecar, plugin} {
		deadline := time.Now().Add(10 * time.Second)
		for _, err := os.Stat(s); err != nil; _, err = os.Stat(s) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not appear", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	domain, err := os.ReadFile("../domainhook/testdata/kubevirt-v1.9/q35-seabios.xml")
	if err != nil {
		t.Fatal(err)
	}

	res, err := info.NewInfoClient(dial(t, sidecar)).Info(ctx, &info.InfoParams{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Name != kubevirthook.Name || len(res.Versions) != 1 || res.Versions[0] != "v1alpha3" || len(res.HookPoints) != 1 || res.HookPoints[0].Name != "OnDefineDomain" {
		t.Fatalf("handshake: %v", res)
	}

	callbacks := v1alpha3.NewCallbacksClient(dial(t, sidecar))
	out, err := callbacks.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: vmiJSON(t, ftv1.RoleSecondary)})
	if err != nil {
		t.Fatal(err)
	}
	x := string(out.DomainXML)
	for _, want := range []string{"/var/run/lockstep/0c4e2f1a/qmp.sock", "-incoming", "filter-redirector", `alias="ua-rootdisk"`, `alias="ua-datadisk"`,
		"id=colo-disk1,driver=quorum", "vmi-disks/datadisk/disk.img,size=2147483648", "empty-disks/colo-active-1.qcow2"} {
		if !strings.Contains(x, want) {
			t.Errorf("the secondary's domain lacks %s:\n%s", want, x)
		}
	}
	out, err = callbacks.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: vmiJSON(t, "")})
	if err != nil || string(out.DomainXML) != string(domain) {
		t.Errorf("a VMI that is not a member was changed (%v)", err)
	}
	_, err = callbacks.OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: []byte("<domain/>"), Vmi: vmiJSON(t, ftv1.RolePrimary)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "making ns/vm-1 a COLO member") {
		t.Errorf("a domain the hook cannot make a member: %v", err)
	}

	domainHook := plugins.NewDomainHookServiceClient(dial(t, plugin))
	boot := &plugins.SidecarContext{InvocationContext: "Boot"}
	pr, err := domainHook.MutateDomain(ctx, &plugins.MutateDomainRequest{DomainType: "libvirt", Domain: domain, Vmi: vmiJSON(t, ftv1.RolePrimary), SidecarContext: boot})
	if err != nil {
		t.Fatal(err)
	}
	if x := string(pr.Domain); !strings.Contains(x, "driver=quorum") || strings.Contains(x, "-incoming") {
		t.Errorf("the primary's domain:\n%s", x)
	}
	target := &plugins.SidecarContext{InvocationContext: "MigrationTarget"}
	_, err = domainHook.MutateDomain(ctx, &plugins.MutateDomainRequest{DomainType: "libvirt", Domain: domain, Vmi: vmiJSON(t, ftv1.RolePrimary), SidecarContext: target})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a member's migration target was not refused: %v", err)
	}
	pr, err = domainHook.MutateDomain(ctx, &plugins.MutateDomainRequest{DomainType: "libvirt", Domain: domain, Vmi: vmiJSON(t, ""), SidecarContext: target})
	if err != nil || string(pr.Domain) != string(domain) {
		t.Errorf("another VM's migration target was disturbed: %v", err)
	}
}
