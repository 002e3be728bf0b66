package controllers_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/internal/adoption"
)

// Adoption and release: an existing KubeVirt VirtualMachine becomes a FaultTolerantVM on its
// disks, keeping its firmware UUID and MACs, and a FaultTolerantVM goes back to a plain
// VirtualMachine on its current disks. kubevirtdouble.VMController plays KubeVirt's
// VirtualMachine controller; the primaryWatch counts the plain VirtualMachine's VMI as a copy of
// the VM, so that two running at once fail the spec.

// setupLegacyVM makes four nodes and VirtualMachine "vm" as KubeVirt users have them: running,
// its root disk on DataVolume "disk" (claim "disk", which CDI made for it), no firmware UUID
// and no MAC in its spec. It returns the VirtualMachine and its running VMI.
func setupLegacyVM(ns string) (*virtv1.VirtualMachine, *virtv1.VirtualMachineInstance) {
	GinkgoHelper()
	for i := 1; i <= 4; i++ {
		makeNode(fmt.Sprintf("node-%d", i), "zone-a")
	}
	tmpl := newFTVM(ns, "vm").Spec.Template
	tmpl.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "disk"}}
	vm := &virtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns},
		Spec: virtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(virtv1.RunStrategyAlways),
			Template: &virtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Metadata.Labels},
				Spec:       tmpl.Spec,
			},
			// The DataVolume's template: KubeVirt's VirtualMachine controller would take an
			// ownerless DataVolume of this name back.
			DataVolumeTemplates: []virtv1.DataVolumeTemplateSpec{{ObjectMeta: metav1.ObjectMeta{Name: "disk"}}},
		},
	}
	Expect(k8s.Create(ctx(), vm)).To(Succeed())
	owner := func(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	}
	dv := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
		"metadata": map[string]any{"name": "disk", "namespace": ns},
		"spec": map[string]any{
			"source":  map[string]any{"blank": map[string]any{}},
			"storage": map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
		},
	}}
	dv.SetOwnerReferences(owner("kubevirt.io/v1", "VirtualMachine", "vm", vm.UID))
	Expect(k8s.Create(ctx(), dv)).To(Succeed())
	Expect(k8s.Create(ctx(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: ns, OwnerReferences: owner("cdi.kubevirt.io/v1beta1", "DataVolume", "disk", dv.GetUID())},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	})).To(Succeed())
	vmi := &virtv1.VirtualMachineInstance{}
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vmi)).To(Succeed())
		g.Expect(vmi.Status.Phase).To(Equal(virtv1.Running))
		g.Expect(vmi.Status.Interfaces).NotTo(BeEmpty())
	}, timeout, interval).Should(Succeed())
	return vm, vmi
}

// adopt creates the FaultTolerantVM that kubectl ftvm adopt makes of VirtualMachine "vm".
func adopt(ns string) {
	GinkgoHelper()
	vm, vmi := &virtv1.VirtualMachine{}, &virtv1.VirtualMachineInstance{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vm)).To(Succeed())
	if err := k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vmi); apierrors.IsNotFound(err) {
		vmi = nil
	} else {
		Expect(err).NotTo(HaveOccurred())
	}
	f, err := adoption.FaultTolerantVM(vm, vmi, "ft-logging")
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx(), f)).To(Succeed())
}

// identity is what a guest sees of its hardware.
type identity struct {
	firmwareUUID types.UID
	mac          string
}

func identityOf(v *virtv1.VirtualMachineInstance) identity {
	id := identity{}
	if v.Spec.Domain.Firmware != nil {
		id.firmwareUUID = v.Spec.Domain.Firmware.UUID
	}
	for _, iface := range v.Status.Interfaces {
		if iface.Name == "default" {
			id.mac = iface.MAC
		}
	}
	if id.mac == "" && len(v.Spec.Domain.Devices.Interfaces) > 0 {
		id.mac = v.Spec.Domain.Devices.Interfaces[0].MacAddress // a member: the MAC it is given
	}
	return id
}

// expectAdopted checks the end of an adoption: the VirtualMachine gone, its DataVolume and claim
// kept and no longer its, and a Protected pair on claim "disk".
func expectAdopted(ns string) {
	GinkgoHelper()
	expectWholePair(ns, "", 0)
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &virtv1.VirtualMachine{}))
	}, timeout, interval).Should(BeTrue(), "the adopted VirtualMachine is removed")
	dv := &unstructured.Unstructured{}
	dv.SetAPIVersion("cdi.kubevirt.io/v1beta1")
	dv.SetKind("DataVolume")
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "disk"}, dv)).To(Succeed(), "its DataVolume stays")
	Expect(dv.GetDeletionTimestamp()).To(BeNil())
	Expect(dv.GetOwnerReferences()).To(BeEmpty(), "released from the VirtualMachine, so that its deletion leaves it")
	claim := &corev1.PersistentVolumeClaim{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "disk"}, claim)).To(Succeed())
	Expect(claim.DeletionTimestamp).To(BeNil())
}

// primaryOf is the pair's member labelled primary.
func primaryOf(ns string) *virtv1.VirtualMachineInstance {
	GinkgoHelper()
	for _, v := range members(ns, "vm") {
		if v.Labels[ftv1.LabelRole] == ftv1.RolePrimary {
			return &v
		}
	}
	Fail("no primary")
	return nil
}

// releaseFTVM sets onDelete Release and deletes FaultTolerantVM "vm".
func releaseFTVM(ns string) {
	GinkgoHelper()
	f := getFTVM(ns, "vm")
	base := f.DeepCopy()
	f.Spec.OnDelete = ftv1.OnDeleteRelease
	Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(Succeed())
	Expect(k8s.Delete(ctx(), f)).To(Succeed())
}

// expectReleased checks the end of a release: FaultTolerantVM "vm" gone with everything the
// operator made, and VirtualMachine "vm" running the VM with the given identity on rootClaim. It
// then deletes the VirtualMachine, as the spec's cleanup.
func expectReleased(ns, rootClaim string, want identity) {
	GinkgoHelper()
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &ftv1.FaultTolerantVM{}))
	}, timeout, interval).Should(BeTrue())
	vm := &virtv1.VirtualMachine{}
	Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vm)).To(Succeed())
	Expect(*vm.Spec.RunStrategy).To(Equal(virtv1.RunStrategyAlways))
	Expect(vm.Annotations).To(HaveKey(adoption.AnnotationReleasedFrom))
	Expect(members(ns, "vm")).To(BeEmpty())
	root := vm.Spec.Template.Spec.Volumes[0]
	Expect(root.PersistentVolumeClaim != nil && root.PersistentVolumeClaim.ClaimName == rootClaim ||
		root.DataVolume != nil && root.DataVolume.Name == rootClaim).To(BeTrue(), "root on %s: %+v", rootClaim, root.VolumeSource)
	vmi := &virtv1.VirtualMachineInstance{}
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vmi)).To(Succeed())
		g.Expect(vmi.Status.Phase).To(Equal(virtv1.Running))
	}, timeout, interval).Should(Succeed())
	Expect(identityOf(vmi)).To(Equal(want), "the guest keeps its hardware")
	Expect(k8s.Delete(ctx(), vm)).To(Succeed())
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &virtv1.VirtualMachineInstance{}))
	}, timeout, interval).Should(BeTrue())
}

var _ = Describe("Adoption and release", func() {
	AfterEach(func() { deleteAllNodes() })

	It("adopts a running VirtualMachine on its DataVolume, keeping its firmware UUID and MAC, and releases it back", func() {
		ns := newNamespace()
		monitor := watchPrimaries(ns)
		_, legacy := setupLegacyVM(ns)
		before := identityOf(legacy)
		Expect(before.firmwareUUID).NotTo(BeEmpty())
		Expect(before.mac).NotTo(BeEmpty())

		adopt(ns)
		expectAdopted(ns)
		for _, v := range members(ns, "vm") {
			Expect(identityOf(&v)).To(Equal(before), "member %s", v.Name)
		}
		root := primaryOf(ns).Spec.Volumes[0]
		Expect(root.DataVolume).NotTo(BeNil())
		Expect(root.DataVolume.Name).To(Equal("disk"), "the primary runs on the VirtualMachine's disk")
		Expect(eventReasons(ns, "vm")).To(ContainElements(ftv1.ReasonAdopting, ftv1.ReasonAdopted))
		Expect(eventReasons(ns, "vm")).NotTo(ContainElement(ftv1.ReasonAdoptionIdentityChanged))

		releaseFTVM(ns)
		expectReleased(ns, "disk", before)
		monitor.stop()
		Expect(monitor.violations()).To(BeEmpty())
	})

	It("warns when the template gives the adopted guest new hardware; a VirtualMachine that comes back is refused, or else stopped", func() {
		ns := newNamespace()
		monitor := watchPrimaries(ns)
		vm, _ := setupLegacyVM(ns)
		f := newFTVM(ns, "vm") // written by hand: no firmware UUID, no MAC
		f.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "disk"}}
		f.Spec.AdoptFrom = &ftv1.AdoptFrom{VirtualMachineName: "vm"}
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		expectAdopted(ns)
		Expect(eventMessages(ns, "vm", ftv1.ReasonAdoptionIdentityChanged)).To(ContainSubstring("firmware UUID"))

		By("a GitOps tool applying the old VirtualMachine again: the admission policy refuses it")
		again := &virtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns}, Spec: *vm.Spec.DeepCopy()}
		Eventually(func() error { return k8s.Create(ctx(), again.DeepCopy()) }, timeout, interval).
			Should(MatchError(ContainSubstring("a VirtualMachine of that name would run it twice")))

		By("without the policy, the operator stops and removes it")
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Name: "lockstep-adopted-virtualmachines"}, binding)).To(Succeed())
		Expect(k8s.Delete(ctx(), binding)).To(Succeed())
		DeferCleanup(func() {
			binding.ResourceVersion, binding.UID = "", ""
			Expect(k8s.Create(ctx(), binding)).To(Succeed())
		})
		again.Spec.RunStrategy = ptr.To(virtv1.RunStrategyHalted) // (running, the double would start it before the operator could look)
		Eventually(func() error { return k8s.Create(ctx(), again.DeepCopy()) }, timeout, interval).Should(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &virtv1.VirtualMachine{}))
		}, timeout, interval).Should(BeTrue(), "removed again")
		expectWholePair(ns, "", 0)

		By("the adoption cannot be changed")
		f = getFTVM(ns, "vm")
		base := f.DeepCopy()
		f.Spec.AdoptFrom = &ftv1.AdoptFrom{VirtualMachineName: "other"}
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(MatchError(ContainSubstring("adoptFrom cannot be set, changed or removed")))
		f = getFTVM(ns, "vm")
		base = f.DeepCopy()
		f.Spec.OnDelete, f.Spec.DiskRetention = ftv1.OnDeleteRelease, ftv1.DiskRetentionDelete
		Expect(k8s.Patch(ctx(), f, client.MergeFrom(base))).To(MatchError(ContainSubstring("diskRetention must be Retain")))

		deleteAllFTVMs(ns)
		monitor.stop()
		Expect(monitor.violations()).To(BeEmpty())
	})

	It("releases a FaultTolerantVM that failed over onto the disk it runs on now, and waits for a VirtualMachine of its name that it did not make", func() {
		ns := newNamespace()
		setupFailedOverPair(ns)
		want := identityOf(primaryOf(ns))
		Expect(want.firmwareUUID).To(Equal(getFTVM(ns, "vm").UID), "lockstep's own identity: the template has none")

		By("a VirtualMachine of that name that is not lockstep's")
		squatter := &virtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns}, Spec: virtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(virtv1.RunStrategyHalted),
			Template:    &virtv1.VirtualMachineInstanceTemplateSpec{Spec: getFTVM(ns, "vm").Spec.Template.Spec},
		}}
		Expect(k8s.Create(ctx(), squatter)).To(Succeed())
		releaseFTVM(ns)
		Eventually(func() []string { return eventReasons(ns, "vm") }, timeout, interval).Should(ContainElement(ftv1.ReasonReleaseBlocked))
		Expect(getFTVM(ns, "vm").DeletionTimestamp).NotTo(BeNil(), "the deletion waits")
		Expect(members(ns, "vm")).To(BeEmpty(), "the members are stopped")
		Expect(k8s.Delete(ctx(), squatter)).To(Succeed())

		expectReleased(ns, "vm-2-root", want)
		expectRetained(ns, "vm-2-root", "root", "disk")
		Expect(eventMessages(ns, "vm", ftv1.ReasonReleased)).To(ContainSubstring("volume root on claim vm-2-root"))
		Eventually(leftoversIn(ns), timeout, interval).Should(BeEmpty())
	})
})

var _ = Describe("Releasing an adoption that has not finished", func() {
	AfterEach(func() { deleteAllNodes() })

	It("gives the VirtualMachine its run strategy back and starts no member", func() {
		ns := newNamespace()
		monitor := watchPrimaries(ns)
		_, legacy := setupLegacyVM(ns)
		By("its VMI held by a finalizer, as on a node that does not answer: the adoption waits")
		base := legacy.DeepCopy()
		legacy.Finalizers = append(legacy.Finalizers, "lockstep.test/hold")
		Expect(k8s.Patch(ctx(), legacy, client.MergeFrom(base))).To(Succeed())
		adopt(ns)
		waitFor(ns, "vm", "adopting, waiting for the VMI", func(f *ftv1.FaultTolerantVM) bool {
			c := condition(f, ftv1.ConditionProtected)
			return f.Status.State == ftv1.StateStarting && c != nil && c.Reason == ftv1.ReasonAdopting && strings.Contains(c.Message, "waiting for VirtualMachineInstance vm")
		})
		vm := &virtv1.VirtualMachine{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vm)).To(Succeed())
		Expect(*vm.Spec.RunStrategy).To(Equal(virtv1.RunStrategyHalted))

		releaseFTVM(ns)
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &ftv1.FaultTolerantVM{}))
		}, timeout, interval).Should(BeTrue())
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vm)).To(Succeed())
		Expect(*vm.Spec.RunStrategy).To(Equal(virtv1.RunStrategyAlways), "the strategy it had before")
		Expect(vm.Annotations).NotTo(HaveKey("ft.lockstep.dev/run-strategy-before-adoption"))
		Expect(vm.Spec.DataVolumeTemplates).To(HaveLen(1), "untouched")
		Expect(members(ns, "vm")).To(BeEmpty())
		Expect(eventMessages(ns, "vm", ftv1.ReasonReleased)).To(ContainSubstring("had not finished"))

		By("the VMI let go: KubeVirt runs the VM again")
		Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, legacy)).To(Succeed())
		base = legacy.DeepCopy()
		legacy.Finalizers = nil
		Expect(k8s.Patch(ctx(), legacy, client.MergeFrom(base))).To(Succeed())
		Eventually(func(g Gomega) {
			vmi := &virtv1.VirtualMachineInstance{}
			g.Expect(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, vmi)).To(Succeed())
			g.Expect(vmi.DeletionTimestamp).To(BeNil())
			g.Expect(vmi.Status.Phase).To(Equal(virtv1.Running))
		}, timeout, interval).Should(Succeed())
		Expect(k8s.Delete(ctx(), vm)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx(), types.NamespacedName{Namespace: ns, Name: "vm"}, &virtv1.VirtualMachineInstance{}))
		}, timeout, interval).Should(BeTrue())
		monitor.stop()
		Expect(monitor.violations()).To(BeEmpty())
	})
})

var _ = Describe("Crash points of adoption and release", func() {
	AfterEach(func() { deleteAllNodes() })

	It("an adoption converges from a crash after any of its writes: the VirtualMachine stopped before the pair starts, its disks kept", func() {
		runCrashPath(crashPath{
			setup: func(ns string) pairBefore {
				setupLegacyVM(ns)
				return pairBefore{}
			},
			trigger: func(ns string, _ pairBefore) { adopt(ns) },
			check:   func(ns string, _ pairBefore) { expectAdopted(ns) },
			rows: []string{
				"patch FaultTolerantVM vm",           // the finalizer
				"patch VirtualMachine vm",            // set to Halted (the strategy it had noted): KubeVirt stops its VMI
				status("FaultTolerantVM", "vm"),      // Adopting
				"patch VirtualMachine vm",            // its dataVolumeTemplates dropped: KubeVirt cannot take the DataVolume back
				status("FaultTolerantVM", "vm"),      // releasing its disks
				"patch DataVolume disk",              // released from the VirtualMachine
				"delete VirtualMachine vm",           // which goes, its disks staying
				status("FaultTolerantVM", "vm"),      // the pair may start
				"create Lease ft-vm",                 // the record: vm-1 runs the VM
				"create VirtualMachineInstance vm-1", // on the VirtualMachine's DataVolume
				"create PersistentVolumeClaim vm-2-root",
				"create VirtualMachineInstance vm-2",
				status("FaultTolerantVM", "vm"),
				"patch VirtualMachineInstance vm-2", // synchronized
				status("FaultTolerantVM", "vm"),
			},
			// After each of its writes to the VirtualMachine and its disks; the finalizer and the
			// status (rows 1, 3, 5, 8) decide nothing, and from row 9 on the pair starts as any new
			// pair does.
			crashRows: []int{2, 4, 6, 7},
		})
	})

	It("a release converges from a crash after any of its writes: the members gone before the VirtualMachine is made, made once", func() {
		var want identity
		runCrashPath(crashPath{
			setup: func(ns string) pairBefore {
				b := setupFailedOverPair(ns)
				want = identityOf(primaryOf(ns))
				return b
			},
			trigger: func(ns string, _ pairBefore) { releaseFTVM(ns) },
			check: func(ns string, _ pairBefore) {
				expectReleased(ns, "vm-2-root", want)
				Expect(eventReasons(ns, "vm")).To(ContainElement(ftv1.ReasonReleased))
			},
			rows: []string{
				status("FaultTolerantVM", "vm"),         // the onDelete change observed
				"update Lease ft-vm",                    // released: nobody may run the VM
				"patch VirtualMachineInstance vm-2",     // the primary labelled fenced
				"delete VirtualMachineInstance vm-2",    // and deleted
				"delete VirtualMachineInstance vm-3",    // the secondary
				"patch PersistentVolumeClaim vm-2-root", // the current disk kept, no longer the pair's
				"delete PersistentVolumeClaim vm-3-root",
				"delete Lease ft-vm",       // the record: no member may run the VM
				"create VirtualMachine vm", // the one copy of the VM from now on
				"delete NetworkAttachmentDefinition made-net",
				"patch FaultTolerantVM vm", // the finalizer removed
			},
			// Rows 2 to 7 are a deletion's after a failover, crash-tested there
			// (crash_test.go); a crash after row 6 leaves the kept claim for the release to find.
			crashRows: []int{6, 8, 9, 10},
		})
	})
})
