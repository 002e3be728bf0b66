package ftvmctl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/adoption"
	"github.com/lockstep-dev/lockstep/internal/scheme"
)

var now = time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC)

func protectedVM() *ftv1.FaultTolerantVM {
	f := &ftv1.FaultTolerantVM{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "pg", CreationTimestamp: metav1.NewTime(now.Add(-3 * time.Hour))}}
	f.Spec.Protection, f.Spec.RunStrategy = ftv1.ProtectionEnabled, ftv1.RunStrategyRunning
	f.Status.State = ftv1.StateProtected
	f.Status.Primary = &ftv1.MemberStatus{VMI: "pg-1", Node: "node-a"}
	f.Status.Secondary = &ftv1.MemberStatus{VMI: "pg-2", Node: "node-b"}
	f.Status.Replication = &ftv1.ReplicationStatus{
		Primary:   &ftv1.SideStatus{VMI: "pg-1", Node: "node-a", State: ftv1.SideProtected, Epoch: 3, Connected: true, ReportTime: metav1.NewTime(now.Add(-2 * time.Second))},
		Secondary: &ftv1.SideStatus{VMI: "pg-2", Node: "node-b", State: ftv1.SideReplicating, Synchronized: true, ReportTime: metav1.NewTime(now.Add(-time.Second))},
	}
	f.Status.Checkpoints = &ftv1.CheckpointStatus{PauseMilliseconds: ptr.To(int32(4))}
	f.Status.VLockstepInterval = &metav1.Duration{Duration: 2 * time.Second}
	f.Status.FailoverCount = 2
	f.Status.Conditions = []metav1.Condition{{Type: ftv1.ConditionProtected, Status: metav1.ConditionTrue, Reason: ftv1.ReasonProtected,
		Message: "both members run", LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}}
	return f
}

func TestSummarize(t *testing.T) {
	resyncing := protectedVM()
	resyncing.Status.State = ftv1.StateNotProtected
	resyncing.Status.Secondary = &ftv1.MemberStatus{VMI: "pg-3", Node: "node-c"} // lockstepd reported pg-2 last
	resyncing.Status.Resync = &ftv1.ResyncStatus{DoneBytes: ptr.To(int64(1 << 30)), TotalBytes: ptr.To(int64(4 << 30)),
		BytesPerSecond: resource.NewQuantity(1<<20, resource.BinarySI), EstimatedCompletionTime: &metav1.Time{Time: now.Add(3 * time.Minute)}}
	alone := protectedVM()
	alone.Status.State, alone.Status.Secondary, alone.Status.Replication.Secondary = ftv1.StateNotProtected, nil, nil
	alone.Status.Checkpoints, alone.Status.VLockstepInterval = nil, nil
	for _, tc := range []struct {
		name string
		f    *ftv1.FaultTolerantVM
		want Row
	}{
		{"protected", protectedVM(), Row{Namespace: "db", Name: "pg", State: "Protected", Primary: "pg-1@node-a", Secondary: "pg-2@node-b",
			Synced: "yes", Resync: "-", Pause: "4ms", Interval: "2s", Failovers: 2, Age: "3h"}},
		{"resyncing into a new secondary", resyncing, Row{Namespace: "db", Name: "pg", State: "NotProtected", Primary: "pg-1@node-a", Secondary: "pg-3@node-c",
			Synced: "-", Resync: "25% 1.0Gi/4.0Gi, 3m left", Pause: "4ms", Interval: "2s", Failovers: 2, Age: "3h"}},
		{"alone", alone, Row{Namespace: "db", Name: "pg", State: "NotProtected", Primary: "pg-1@node-a", Secondary: "-",
			Synced: "-", Resync: "-", Pause: "-", Interval: "-", Failovers: 2, Age: "3h"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summarize(tc.f, now); got != tc.want {
				t.Fatalf("Summarize =\n%+v, want\n%+v", got, tc.want)
			}
		})
	}
}

// env runs the plugin against a fake API with the objects given.
func env(t *testing.T, objs ...client.Object) (Env, client.Client, *bytes.Buffer, *bytes.Buffer) {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).
		WithStatusSubresource(&ftv1.FaultTolerantVM{}, &ftv1.FaultTolerantVMOperation{}).Build()
	var out, errb bytes.Buffer
	return Env{Out: &out, Err: &errb, Now: func() time.Time { return now },
		Client: func(string, string) (client.Client, string, error) { return c, "db", nil }}, c, &out, &errb
}

func TestStatusListsAndDescribes(t *testing.T) {
	e, _, out, _ := env(t, protectedVM())
	if code := Main([]string{"status"}, e); code != 0 {
		t.Fatalf("status: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME ") || strings.Join(strings.Fields(lines[1]), " ") != "pg Protected pg-1@node-a pg-2@node-b yes - 4ms 2s 2 3h" {
		t.Fatalf("status:\n%s", out)
	}
	out.Reset()
	if code := Main([]string{"status", "pg"}, e); code != 0 {
		t.Fatalf("status pg: exit %d", code)
	}
	for _, want := range []string{"Secondary:   pg-2@node-b (synchronized: yes)", "primary    pg-1@node-a  Protected, epoch 3", "Protected  True    Protected"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status pg lacks %q:\n%s", want, out)
		}
	}
}

func TestOperationsCreateTheirObjectAndWait(t *testing.T) {
	e, c, out, errb := env(t, protectedVM())
	if code := Main([]string{"migrate-secondary", "pg", "--node", "node-c"}, e); code != 0 {
		t.Fatalf("migrate-secondary: exit %d: %s", code, errb)
	}
	var ops ftv1.FaultTolerantVMOperationList
	if err := c.List(context.Background(), &ops); err != nil || len(ops.Items) != 1 {
		t.Fatalf("operations: %v, %v", ops.Items, err)
	}
	op := ops.Items[0]
	if op.Namespace != "db" || !strings.HasPrefix(op.Name, "pg-migratesecondary-") || op.Spec.FaultTolerantVMName != "pg" ||
		op.Spec.Type != ftv1.OperationMigrateSecondary || op.Spec.Node != "node-c" {
		t.Fatalf("the operation: %+v", op)
	}
	if !strings.Contains(out.String(), "faulttolerantvmoperation.ft.lockstep.dev/"+op.Name+" created") {
		t.Fatalf("output: %s", out)
	}

	// --wait follows it: the operator's answer ends the command.
	go func() {
		for {
			var l ftv1.FaultTolerantVMOperationList
			_ = c.List(context.Background(), &l)
			for i := range l.Items {
				if o := &l.Items[i]; o.Spec.Type == ftv1.OperationTestFailover && o.Status.Phase == "" {
					o.Status.Phase, o.Status.Message = ftv1.OperationFailed, "the secondary is not synchronized"
					_ = c.Status().Update(context.Background(), o)
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	errb.Reset()
	if code := Main([]string{"test-failover", "--wait=20s", "pg"}, e); code != 1 || !strings.Contains(errb.String(), "failed: the secondary is not synchronized") {
		t.Fatalf("test-failover --wait: exit %d: %s", code, errb)
	}

	for _, args := range [][]string{{"restart-secondary", "pg", "--node", "x"}, {"test-failover", "nope"}, {"test-failover"}, {"frobnicate", "pg"}, {"status", "pg", "other"}} {
		errb.Reset()
		if code := Main(args, e); code != 1 || errb.Len() == 0 {
			t.Fatalf("%v: exit %d, %q; want an error", args, code, errb)
		}
	}
}

func TestProtection(t *testing.T) {
	e, c, _, errb := env(t, protectedVM())
	if code := Main([]string{"protection", "pg", "suspended"}, e); code != 0 {
		t.Fatalf("protection: exit %d: %s", code, errb)
	}
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "db", Name: "pg"}, f); err != nil || f.Spec.Protection != ftv1.ProtectionSuspended {
		t.Fatalf("protection %q, %v; want Suspended", f.Spec.Protection, err)
	}
	if code := Main([]string{"protection", "pg", "off"}, e); code != 1 {
		t.Fatal("protection off: want an error")
	}
}

func TestConsoleIsThePrimarys(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "virtctl"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	f := protectedVM()
	f.Status.Primary = &ftv1.MemberStatus{VMI: "pg-2", Node: "node-b"} // after a failover
	e, _, _, errb := env(t, f)
	var ran []string
	e.Exec = func(path string, args []string) error { ran = append([]string{path}, args...); return nil }
	if code := Main([]string{"console", "pg", "--context", "prod"}, e); code != 0 {
		t.Fatalf("console: exit %d: %s", code, errb)
	}
	if want := []string{filepath.Join(dir, "virtctl"), "virtctl", "console", "pg-2", "--namespace", "db", "--context", "prod"}; strings.Join(ran, " ") != strings.Join(want, " ") {
		t.Fatalf("console ran %v, want %v", ran, want)
	}
}

func legacyVM() (*virtv1.VirtualMachine, *virtv1.VirtualMachineInstance) {
	guest := resource.MustParse("1Gi")
	vm := &virtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "legacy", UID: "vm-uid"},
		Spec: virtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(virtv1.RunStrategyAlways),
			Template: &virtv1.VirtualMachineInstanceTemplateSpec{Spec: virtv1.VirtualMachineInstanceSpec{
				Domain: virtv1.DomainSpec{
					Memory:  &virtv1.Memory{Guest: &guest},
					Devices: virtv1.Devices{Interfaces: []virtv1.Interface{{Name: "default"}}},
				},
				Volumes: []virtv1.Volume{{Name: "root", VolumeSource: virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "legacy-root"}}}},
			}},
		},
	}
	vmi := &virtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "legacy"},
		Spec:       virtv1.VirtualMachineInstanceSpec{Domain: virtv1.DomainSpec{Firmware: &virtv1.Firmware{UUID: "vm-uid"}}},
		Status:     virtv1.VirtualMachineInstanceStatus{Interfaces: []virtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: "02:11:22:33:44:55"}}},
	}
	return vm, vmi
}

func TestAdoptPrintsOrCreatesTheFaultTolerantVM(t *testing.T) {
	vm, vmi := legacyVM()
	e, c, out, errb := env(t, vm, vmi)
	if code := Main([]string{"adopt", "legacy", "--logging-network", "lockstep-system/ft-logging", "-o", "yaml"}, e); code != 0 {
		t.Fatalf("adopt -o yaml: exit %d: %s", code, errb)
	}
	for _, want := range []string{"kind: FaultTolerantVM", "virtualMachineName: legacy", "name: lockstep-system/ft-logging", "uuid: vm-uid", `macAddress: "02:11:22:33:44:55"`, "name: legacy-root"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("adopt -o yaml lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out.String(), "status:") || strings.Contains(out.String(), "creationTimestamp") {
		t.Fatalf("adopt -o yaml prints what a manifest does not hold:\n%s", out)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "db", Name: "legacy"}, &ftv1.FaultTolerantVM{}); err == nil {
		t.Fatal("-o yaml created the FaultTolerantVM")
	}
	if code := Main([]string{"adopt", "legacy", "--logging-network", "ft-logging"}, e); code != 0 {
		t.Fatalf("adopt: exit %d: %s", code, errb)
	}
	f := &ftv1.FaultTolerantVM{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "db", Name: "legacy"}, f); err != nil || f.Spec.AdoptFrom == nil || f.Spec.Template.Spec.Domain.Firmware.UUID != "vm-uid" {
		t.Fatalf("adopt created %+v, %v", f.Spec, err)
	}
	for _, args := range [][]string{{"adopt", "legacy"}, {"adopt", "missing", "--logging-network", "n"}, {"adopt", "legacy", "--logging-network", "n", "-o", "json"}} {
		errb.Reset()
		if code := Main(args, e); code != 1 || errb.Len() == 0 {
			t.Fatalf("%v: exit %d, %q; want an error", args, code, errb)
		}
	}
}

func TestReleaseSetsOnDeleteAndDeletes(t *testing.T) {
	f := protectedVM()
	f.UID = "ftvm-uid"
	e, c, out, errb := env(t, f)
	// The operator's part: once the FaultTolerantVM is gone, the VirtualMachine it was released into.
	go func() {
		for {
			got := &ftv1.FaultTolerantVM{}
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "db", Name: "pg"}, got); apierrors.IsNotFound(err) {
				_ = c.Create(context.Background(), &virtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "pg",
					Annotations: map[string]string{adoption.AnnotationReleasedFrom: string(f.UID)}}})
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if code := Main([]string{"release", "pg", "--wait=20s"}, e); code != 0 {
		t.Fatalf("release: exit %d: %s", code, errb)
	}
	if !strings.Contains(out.String(), "virtualmachine.kubevirt.io/pg runs the VM") {
		t.Fatalf("output: %s", out)
	}

	deleting := protectedVM()
	deleting.Spec.DiskRetention = ftv1.DiskRetentionDelete
	e, _, _, errb = env(t, deleting)
	if code := Main([]string{"release", "pg"}, e); code != 1 || !strings.Contains(errb.String(), "diskRetention Delete") {
		t.Fatalf("release with diskRetention Delete: exit %d: %s", code, errb)
	}
}
