package controllers_test

import (
	"strings"
	"sync"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ftv1 "github.com/lockstep-dev/lockstep/api/v1alpha1"
	"github.com/lockstep-dev/lockstep/controllers"
)

// warningClient is a client that keeps the warnings the API server returns (admission warnings).
type warningClient struct {
	client.Client
	mu       sync.Mutex
	warnings []string
}

func (w *warningClient) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings = append(w.warnings, text)
}

func (w *warningClient) Warnings() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.warnings, "\n")
}

func newWarningClient() *warningClient {
	w := &warningClient{}
	c := rest.CopyConfig(cfg)
	c.WarningHandler = w
	var err error
	w.Client, err = client.New(c, client.Options{Scheme: controllers.NewScheme()})
	Expect(err).NotTo(HaveOccurred())
	return w
}

// setAllocatable gives a node the allocatable CPU and memory of a machine.
func setAllocatable(name, cpu, memory string) {
	Eventually(func() error {
		node := &corev1.Node{}
		if err := k8s.Get(ctx(), types.NamespacedName{Name: name}, node); err != nil {
			return err
		}
		node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
		return k8s.Status().Update(ctx(), node)
	}, timeout, interval).Should(Succeed())
}

var _ = Describe("Admission (the operator's webhooks)", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		makeNode("node-1", "zone-a")
		makeNode("node-2", "zone-b")
	})
	AfterEach(func() {
		// These specs end right after an admission; the operator's first reconcile of what they
		// admitted may still be under way. Deleting only once it holds its finalizer keeps a
		// delete from racing that reconcile (envtest has no garbage collector to clean after it).
		waitTaken(ns)
		deleteAllFTVMs(ns)
		deleteAllNodes()
	})

	type mutation func(*ftv1.FaultTolerantVM)
	spec := func(f *ftv1.FaultTolerantVM) *virtv1.VirtualMachineInstanceSpec { return &f.Spec.Template.Spec }
	q := resource.MustParse

	DescribeTable("refuses what FT cannot protect, saying what to change",
		func(mutate mutation, want string) {
			f := newFTVM(ns, "vm")
			mutate(f)
			err := k8s.Create(ctx(), f)
			Expect(err).To(HaveOccurred(), "admitted")
			Expect(err.Error()).To(ContainSubstring(want))
			Expect(k8s.Get(ctx(), client.ObjectKeyFromObject(f), &ftv1.FaultTolerantVM{})).NotTo(Succeed(), "stored")
		},
		Entry("an unknown runStrategy (the CRD's schema)", func(f *ftv1.FaultTolerantVM) { f.Spec.RunStrategy = "Sometimes" }, "Unsupported value"),
		Entry("a name too long for the members' names", func(f *ftv1.FaultTolerantVM) { f.Name = strings.Repeat("a", 57) }, "metadata.name: Too long"),
		Entry("a name that is not a DNS label", func(f *ftv1.FaultTolerantVM) { f.Name = "mail.01" }, "hostnames must be DNS labels"),
		Entry("a key of lockstep's own in the template's metadata", func(f *ftv1.FaultTolerantVM) {
			f.Spec.Template.Metadata.Annotations = map[string]string{ftv1.AnnotationReplicaOf: "vm-2"}
		}, "spec.template.metadata.annotations[ft.lockstep.dev/replica-of]: Forbidden"),
		Entry("no guest memory", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.Memory = nil }, "the guest memory must be set"),
		Entry("a GPU", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.GPUs = []virtv1.GPU{{Name: "g", DeviceName: "nvidia.com/A100"}}
		}, "GPUs cannot be fault tolerant"),
		Entry("a host device", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.HostDevices = []virtv1.HostDevice{{Name: "h", DeviceName: "intel.com/qat"}}
		}, "host devices cannot be fault tolerant"),
		Entry("USB passthrough", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.ClientPassthrough = &virtv1.ClientPassthroughDevices{}
		}, "USB client passthrough cannot be fault tolerant"),
		Entry("an SR-IOV NIC", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Interfaces = []virtv1.Interface{{Name: "default", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{SRIOV: &virtv1.InterfaceSRIOV{}}}}
		}, "SR-IOV interfaces are passthrough devices"),
		Entry("a virtiofs filesystem", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Filesystems = []virtv1.Filesystem{{Name: "fs", Virtiofs: &virtv1.FilesystemVirtiofs{}}}
		}, "virtiofs filesystems are shared host state"),
		Entry("a persistent TPM", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.TPM = &virtv1.TPMDevice{Persistent: ptr.To(true)}
		}, "a persistent TPM keeps its state"),
		Entry("persistent EFI variables", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Firmware = &virtv1.Firmware{Bootloader: &virtv1.Bootloader{EFI: &virtv1.EFI{Persistent: ptr.To(true)}}}
		}, "persistent EFI variables"),
		Entry("a confidential VM", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.LaunchSecurity = &virtv1.LaunchSecurity{SEV: &virtv1.SEV{}}
		}, "confidential VMs (SEV, SNP, TDX)"),
		Entry("downward metrics", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.DownwardMetrics = &virtv1.DownwardMetrics{}
		}, "downward metrics show each member its own host"),
		Entry("a downward metrics volume", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes = append(spec(f).Volumes, virtv1.Volume{Name: "dm", VolumeSource: virtv1.VolumeSource{DownwardMetrics: &virtv1.DownwardMetricsVolumeSource{}}})
		}, "spec.template.spec.volumes[1].downwardMetrics"),
		Entry("a LUN", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Disks[0].DiskDevice = virtv1.DiskDevice{LUN: &virtv1.LunTarget{}}
		}, "a LUN passes SCSI commands"),
		Entry("persistent reservations", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Disks[0].DiskDevice = virtv1.DiskDevice{LUN: &virtv1.LunTarget{Reservation: true}}
		}, "SCSI persistent reservations"),
		Entry("a shareable disk", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.Devices.Disks[0].Shareable = ptr.To(true) }, "cannot be shared with other VMs"),
		Entry("a hostDisk volume", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes[0].VolumeSource = virtv1.VolumeSource{HostDisk: &virtv1.HostDisk{Path: "/x", Type: virtv1.HostDiskExists}}
		}, "hostDisk volumes cannot be fault tolerant"),
		Entry("a hot-pluggable dataVolume volume", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes[0].VolumeSource = virtv1.VolumeSource{DataVolume: &virtv1.DataVolumeSource{Name: "dv", Hotpluggable: true}}
		}, "hotplugged volumes are not supported"),
		Entry("a memory dump volume", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes[0].VolumeSource = virtv1.VolumeSource{MemoryDump: &virtv1.MemoryDumpVolumeSource{}}
		}, "memoryDump volumes are not supported"),
		Entry("a hot-pluggable volume", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes[0].VolumeSource = virtv1.VolumeSource{PersistentVolumeClaim: &virtv1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}, Hotpluggable: true}}
		}, "hotplugged volumes are not supported"),
		Entry("CPU hotplug", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.CPU = &virtv1.CPU{Sockets: 1, MaxSockets: 4} }, "CPU hotplug is not supported"),
		Entry("memory hotplug", func(f *ftv1.FaultTolerantVM) {
			m := q("4Gi")
			spec(f).Domain.Memory.MaxGuest = &m
		}, "memory hotplug is not supported"),
		Entry("guest memory above the memory request (overcommit)", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: q("512Mi")}
		}, "FT reserves the guest memory in full: set it to the guest memory (1Gi)"),
		Entry("a memory limit other than the guest memory", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: q("2Gi")}
		}, "spec.template.spec.domain.resources.limits.memory"),
		Entry("a CPU request below the vCPUs", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.CPU = &virtv1.CPU{Cores: 2}
			spec(f).Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q("500m")}
		}, "FT reserves a whole host CPU per vCPU: set it to the vCPU count (2)"),
		Entry("an overcommitted guest overhead", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.Resources.OvercommitGuestOverhead = true }, "remove overcommitGuestOverhead"),
		Entry("an interface named like the logging network", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Interfaces[0].Name = "ft-logging"
			spec(f).Networks[0].Name = "ft-logging"
		}, "reserved for the FT logging network"),
		Entry("a guest NIC on the logging network", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Interfaces = append(spec(f).Domain.Devices.Interfaces, virtv1.Interface{Name: "net1", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}})
			spec(f).Networks = append(spec(f).Networks, virtv1.Network{Name: "net1", NetworkSource: virtv1.NetworkSource{Multus: &virtv1.MultusNetwork{NetworkName: "ft-logging"}}})
		}, "not attached to the guest"),
		Entry("a multiqueue NIC", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(true) },
			"COLO compares the packets of a NIC with one queue"),
		Entry("two NICs", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Interfaces = append(spec(f).Domain.Devices.Interfaces, virtv1.Interface{Name: "net1", InterfaceBindingMethod: virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}})
			spec(f).Networks = append(spec(f).Networks, virtv1.Network{Name: "net1", NetworkSource: virtv1.NetworkSource{Multus: &virtv1.MultusNetwork{NetworkName: "vm-net"}}})
		}, "COLO compares the packets of one NIC; the template has 2"),
		Entry("bridge binding on the pod network", func(f *ftv1.FaultTolerantVM) {
			spec(f).Domain.Devices.Interfaces[0].InterfaceBindingMethod = virtv1.InterfaceBindingMethod{Bridge: &virtv1.InterfaceBridge{}}
		}, "bridge binding on the pod network gives the guest its launcher pod's address"),
		Entry("a cloud-init config drive", func(f *ftv1.FaultTolerantVM) {
			spec(f).Volumes = append(spec(f).Volumes, virtv1.Volume{Name: "ci", VolumeSource: virtv1.VolumeSource{CloudInitConfigDrive: &virtv1.CloudInitConfigDriveSource{UserData: "#cloud-config"}}})
			spec(f).Domain.Devices.Disks = append(spec(f).Domain.Devices.Disks, virtv1.Disk{Name: "ci"})
		}, "use cloudInitNoCloud"),
		Entry("a liveness probe", func(f *ftv1.FaultTolerantVM) {
			spec(f).LivenessProbe = &virtv1.Probe{Handler: virtv1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(22)}}}
		}, "liveness probes are not supported on fault tolerant VMs"),
		Entry("a readiness probe", func(f *ftv1.FaultTolerantVM) {
			spec(f).ReadinessProbe = &virtv1.Probe{Handler: virtv1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(22)}}}
		}, "readiness probes are not supported on fault tolerant VMs"),
		Entry("a logging network that does not exist", func(f *ftv1.FaultTolerantVM) { f.Spec.LoggingNetwork.Name = "no-such-network" },
			"create it first, or give spec.loggingNetwork.config"),
		Entry("a logging network configuration that is not CNI", func(f *ftv1.FaultTolerantVM) {
			f.Spec.LoggingNetwork = ftv1.LoggingNetwork{Name: "new-network", Config: `{"type":"macvlan"}`}
		}, `the CNI configuration has no "cniVersion"`),
		Entry("more vCPUs than any node's FT vCPU limit", func(f *ftv1.FaultTolerantVM) { spec(f).Domain.CPU = &virtv1.CPU{Cores: 12} },
			"no node can hold a member of this VM (12 vCPUs"),
		Entry("a logging bandwidth above every node's budget", func(f *ftv1.FaultTolerantVM) {
			f.Spec.ExpectedLoad = &ftv1.ExpectedLoad{DiskReadMBps: 200}
		}, "the logging bandwidth budget is 1000 Mbit/s"),
	)

	It("refuses a VM in a namespace whose Pod Security level refuses its members' launcher pods, and admits it once the namespace is privileged", func() {
		label := func(level string) {
			n := &corev1.Namespace{}
			Expect(k8s.Get(ctx(), types.NamespacedName{Name: ns}, n)).To(Succeed())
			n.Labels["pod-security.kubernetes.io/enforce"] = level
			Expect(k8s.Update(ctx(), n)).To(Succeed())
		}
		label("baseline")
		Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(MatchError(And(
			ContainSubstring(`the namespace enforces Pod Security level "baseline"`),
			ContainSubstring("pod-security.kubernetes.io/enforce=privileged"))))
		label("privileged")
		Expect(k8s.Create(ctx(), newFTVM(ns, "vm"))).To(Succeed())
	})

	It("refuses a logging network whose definition Multus could not use", func() {
		Expect(k8s.Create(ctx(), &nadv1.NetworkAttachmentDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: ns},
			Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion": "0.3.1"`},
		})).To(Succeed())
		f := newFTVM(ns, "vm")
		f.Spec.LoggingNetwork.Name = "broken"
		Expect(k8s.Create(ctx(), f)).To(MatchError(ContainSubstring("cannot carry the logging network: not a JSON object")))
	})

	It("refuses a VM larger than any node's memory, and warns when only one node can hold it", func() {
		for _, n := range []string{"node-1", "node-2"} {
			setAllocatable(nodeName(n), "16", "8Gi")
		}
		big := newFTVM(ns, "big")
		m := resource.MustParse("16Gi")
		big.Spec.Template.Spec.Domain.Memory.Guest = &m
		Expect(k8s.Create(ctx(), big)).To(MatchError(ContainSubstring("2 nodes where it has 8Gi of memory to allocate")))

		setAllocatable(nodeName("node-2"), "16", "32Gi")
		w := newWarningClient()
		big = newFTVM(ns, "big")
		big.Spec.Template.Spec.Domain.Memory.Guest = &m
		Expect(w.Create(ctx(), big)).To(Succeed())
		Expect(w.Warnings()).To(ContainSubstring("only node " + nodeName("node-2") + " can hold a member of this VM"))
	})

	It("lets a node's FT limit annotation raise the vCPU limit", func() {
		Eventually(func() error {
			node := &corev1.Node{}
			if err := k8s.Get(ctx(), types.NamespacedName{Name: nodeName("node-1")}, node); err != nil {
				return err
			}
			node.Annotations = map[string]string{ftv1.AnnotationNodeMaxVCPUs: "16"}
			return k8s.Update(ctx(), node)
		}, timeout, interval).Should(Succeed())
		f := newFTVM(ns, "wide")
		f.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 12}
		Eventually(func() error { return k8s.Create(ctx(), f) }, timeout, interval).Should(Succeed(), "the webhook's cache sees the annotation")
	})

	It("sets the defaults, and keeps what the user set", func() {
		f := newFTVM(ns, "defaults")
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		got := getFTVM(ns, "defaults")
		Expect(got.Spec.RunStrategy).To(Equal(ftv1.RunStrategyRunning))
		Expect(got.Spec.UpdatePolicy).To(Equal(ftv1.UpdatePolicyStaged))
		Expect(got.Spec.Protection).To(Equal(ftv1.ProtectionEnabled))
		Expect(got.Spec.Template.Spec.Domain.Resources.Requests).To(BeEmpty(), "no derived value is written into the spec")

		f = newFTVM(ns, "set")
		f.Spec.RunStrategy = ftv1.RunStrategyHalted
		f.Spec.UpdatePolicy = ftv1.UpdatePolicyRefuse
		f.Spec.Protection = ftv1.ProtectionSuspended
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		got = getFTVM(ns, "set")
		Expect(got.Spec.RunStrategy).To(Equal(ftv1.RunStrategyHalted))
		Expect(got.Spec.UpdatePolicy).To(Equal(ftv1.UpdatePolicyRefuse))
		Expect(got.Spec.Protection).To(Equal(ftv1.ProtectionSuspended))
	})

	It("changes nothing when the same manifest is applied twice (server-side apply)", func() {
		f := newFTVM(ns, "applied")
		f.SetGroupVersionKind(ftv1.GroupVersion.WithKind("FaultTolerantVM"))
		f.Spec.RunStrategy = ftv1.RunStrategyHalted // nothing starts, so only the apply writes
		apply := func() string {
			raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
			Expect(err).NotTo(HaveOccurred())
			u := &unstructured.Unstructured{Object: raw}
			unstructured.RemoveNestedField(u.Object, "status")
			unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
			Expect(k8s.Apply(ctx(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("gitops"), client.ForceOwnership)).To(Succeed())
			return getFTVM(ns, "applied").ResourceVersion
		}
		apply()
		waitForState(ns, "applied", ftv1.StateStopped) // the operator's writes (finalizer, status) are done
		first := getFTVM(ns, "applied").ResourceVersion
		Expect(apply()).To(Equal(first), "the second apply wrote the object")
	})

	It("refuses template changes while the VM runs under updatePolicy Refuse, and takes them when it is halted", func() {
		f := newFTVM(ns, "locked")
		f.Spec.UpdatePolicy = ftv1.UpdatePolicyRefuse
		Expect(k8s.Create(ctx(), f)).To(Succeed())
		change := func(mutate func(*ftv1.FaultTolerantVM)) error {
			got := getFTVM(ns, "locked")
			mutate(got)
			return k8s.Update(ctx(), got)
		}
		bigger := func(g *ftv1.FaultTolerantVM) { g.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 2} }
		// Retried: the operator writes the object too (its finalizer), which a write may conflict with.
		Eventually(func() error { return change(bigger) }, timeout, interval).
			Should(MatchError(ContainSubstring("updatePolicy is Refuse and the VM runs: set runStrategy to Halted first")))
		Eventually(func() error {
			return change(func(g *ftv1.FaultTolerantVM) { g.Spec.RunStrategy = ftv1.RunStrategyHalted })
		}, timeout, interval).Should(Succeed())
		Eventually(func() error { return change(bigger) }, timeout, interval).Should(Succeed())
	})

	It("accepts template changes while the VM runs under updatePolicy Staged", func() {
		Expect(k8s.Create(ctx(), newFTVM(ns, "staged"))).To(Succeed())
		Eventually(func() error {
			got := getFTVM(ns, "staged")
			got.Spec.Template.Spec.Domain.CPU = &virtv1.CPU{Cores: 2}
			return k8s.Update(ctx(), got)
		}, timeout, interval).Should(Succeed())
	})

	It("never blocks halting a VM whose logging network went away after admission", func() {
		Expect(k8s.Create(ctx(), newFTVM(ns, "orphan"))).To(Succeed())
		Expect(k8s.Delete(ctx(), &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: "ft-logging", Namespace: ns}})).To(Succeed())
		Eventually(func() error {
			got := getFTVM(ns, "orphan")
			got.Spec.RunStrategy = ftv1.RunStrategyHalted
			return k8s.Update(ctx(), got)
		}, timeout, interval).Should(Succeed())
	})

	It("refuses the live migration of a member and admits other VMs' migrations", func() {
		Expect(k8s.Create(ctx(), newFTVM(ns, "pinned"))).To(Succeed())
		Eventually(func() int { return len(members(ns, "pinned")) }, timeout, interval).Should(Equal(2))
		member := members(ns, "pinned")[0]
		migration := &virtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "migrate-"},
			Spec:       virtv1.VirtualMachineInstanceMigrationSpec{VMIName: member.Name},
		}
		Eventually(func() error { return k8s.Create(ctx(), migration.DeepCopy()) }, timeout, interval).
			Should(MatchError(ContainSubstring("live migration would start a third copy of the VM outside the pair")))
		other := migration.DeepCopy()
		other.Spec.VMIName = "a-plain-vm"
		Expect(k8s.Create(ctx(), other, client.DryRunAll)).To(Succeed())
	})

	It("records a spec admitted before the webhook existed as invalid, starts nothing from it, and still lets it be halted", func() {
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		Expect(k8s.Get(ctx(), types.NamespacedName{Name: "validating-webhook-configuration"}, vwc)).To(Succeed())
		restore := vwc.DeepCopy()
		restore.ResourceVersion, restore.UID = "", ""
		recreate := func() error { return k8s.Create(ctx(), restore.DeepCopy()) }
		Expect(k8s.Delete(ctx(), vwc)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreAlreadyExists(recreate())).To(Succeed()) })

		// A rule of the webhook's alone (the CRD's own rules hold without it).
		invalid := newFTVM(ns, "dump")
		invalid.Spec.Template.Spec.Volumes[0].VolumeSource = virtv1.VolumeSource{MemoryDump: &virtv1.MemoryDumpVolumeSource{}}
		Eventually(func() error { return k8s.Create(ctx(), invalid.DeepCopy()) }, timeout, interval).Should(Succeed())
		Expect(recreate()).To(Succeed())

		Eventually(func() string {
			c := condition(getFTVM(ns, "dump"), ftv1.ConditionValid)
			if c == nil || c.Status != metav1.ConditionFalse {
				return ""
			}
			return c.Message
		}, timeout, interval).Should(ContainSubstring("memoryDump volumes are not supported"))
		Expect(members(ns, "dump")).To(BeEmpty())
		Expect(eventReasons(ns, "dump")).To(ContainElement(ftv1.ReasonInvalidSpec))

		By("the webhook refuses a new change that is invalid, but not the halt of a spec it would refuse")
		Eventually(func() error {
			got := getFTVM(ns, "dump")
			got.Spec.Template.Spec.Domain.Devices.GPUs = []virtv1.GPU{{Name: "g", DeviceName: "nvidia.com/A100"}}
			return k8s.Update(ctx(), got)
		}, timeout, interval).Should(MatchError(ContainSubstring("GPUs cannot be fault tolerant")))
		Eventually(func() error {
			got := getFTVM(ns, "dump")
			got.Spec.RunStrategy = ftv1.RunStrategyHalted
			return k8s.Update(ctx(), got)
		}, timeout, interval).Should(Succeed())
	})
})

// waitTaken waits until the operator holds its finalizer on every FaultTolerantVM of ns.
func waitTaken(ns string) {
	Eventually(func(g Gomega) {
		var list ftv1.FaultTolerantVMList
		g.Expect(k8s.List(ctx(), &list, client.InNamespace(ns))).To(Succeed())
		for _, f := range list.Items {
			g.Expect(f.Finalizers).To(ContainElement(ftv1.Finalizer), f.Name)
		}
	}, timeout, interval).Should(Succeed())
}
